use super::*;

/// A discovery that counts how often it ran.
fn counting(runs: &mut u32) -> impl FnOnce() -> Result<u32, io::Error> + '_ {
    move || {
        *runs += 1;
        Ok(*runs)
    }
}

/// While the fingerprint holds the last discovery is handed out again; a
/// changed one discovers at once and starts the count anew.
#[test]
fn reused_until_the_fingerprint_changes() {
    let mut cache: DiscoveryCache<&str, u32> = DiscoveryCache::new(100);
    let mut runs = 0;
    let first = cache.get(Some("a"), counting(&mut runs)).unwrap();
    assert_eq!((*first.value, first.discovered), (1, true));
    for n in 1..=5 {
        let again = cache.get(Some("a"), counting(&mut runs)).unwrap();
        assert_eq!((*again.value, again.discovered), (1, false));
        assert_eq!(cache.reused(), Some(n));
    }
    let changed = cache.get(Some("b"), counting(&mut runs)).unwrap();
    assert_eq!((*changed.value, changed.discovered), (2, true));
    assert_eq!(cache.reused(), Some(0));
    assert_eq!(runs, 2);
}

/// With `full_every` N, scan k (from 0) discovers when k is a multiple of
/// N: at the default 60 and a 10 s rescan, once every 10 minutes.
#[test]
fn a_full_discovery_every_nth_scan_whatever_the_fingerprint() {
    for full_every in [1, 2, 6, DiscoveryCache::<(), ()>::DEFAULT_FULL_EVERY] {
        let mut cache: DiscoveryCache<(), u32> = DiscoveryCache::new(full_every);
        let mut runs = 0;
        let discovered: Vec<u32> = (0..3 * full_every)
            .filter(|_| cache.get(Some(()), counting(&mut runs)).unwrap().discovered)
            .collect();
        let want: Vec<u32> = (0..3).map(|k| k * full_every).collect();
        assert_eq!(discovered, want, "full_every {full_every}");
        assert_eq!(runs, 3);
    }
    let default: DiscoveryCache<(), ()> = DiscoveryCache::default();
    assert_eq!(default.full_every, 60);
    assert_eq!(
        60 * std::time::Duration::from_secs(10),
        std::time::Duration::from_secs(600),
        "the doc's 10 minutes at the default 10 s rescan"
    );
    assert_eq!(DiscoveryCache::<(), u32>::new(0).full_every, 1);
}

/// No fingerprint (something unreadable): every scan discovers. A failed
/// discovery leaves nothing to reuse.
#[test]
fn nothing_is_reused_without_a_fingerprint_or_after_a_failure() {
    let mut cache: DiscoveryCache<&str, u32> = DiscoveryCache::new(100);
    let mut runs = 0;
    assert!(cache.get(None, counting(&mut runs)).unwrap().discovered);
    assert!(cache.get(None, counting(&mut runs)).unwrap().discovered);
    assert_eq!(cache.value(), Some(&2));

    assert!(
        cache
            .get(Some("a"), counting(&mut runs))
            .unwrap()
            .discovered
    );
    let failed = cache.get(Some("a"), || Err::<u32, _>(io::Error::other("gone")));
    assert!(failed.is_ok(), "reused, so not run");
    let failed = cache.get(Some("b"), || Err::<u32, _>(io::Error::other("gone")));
    assert!(failed.is_err());
    assert_eq!(cache.value(), None);
    assert!(
        cache
            .get(Some("b"), counting(&mut runs))
            .unwrap()
            .discovered
    );
}

/// What a driver builds from a discovery lives with it and goes with it.
#[test]
fn the_value_can_carry_what_is_built_from_it() {
    let mut cache: DiscoveryCache<u8, (u32, Option<String>)> = DiscoveryCache::new(10);
    let found = cache
        .get(Some(1), || Ok::<_, io::Error>((7, None)))
        .unwrap();
    found.value.1 = Some("devices".into());
    let again = cache
        .get(Some(1), || Ok::<_, io::Error>((8, None)))
        .unwrap();
    assert_eq!(again.value.1.as_deref(), Some("devices"));
    if let Some(value) = cache.value_mut() {
        value.0 = 9;
    }
    assert_eq!(cache.value(), Some(&(9, Some("devices".into()))));
    cache.clear();
    assert_eq!(cache.value(), None, "cleared");
    let fresh = cache
        .get(Some(1), || Ok::<_, io::Error>((8, None)))
        .unwrap();
    assert_eq!(*fresh.value, (8, None));
}

/// Listings are sorted and an absent directory lists as empty; a file's
/// contents and a path's existence count; something unreadable for another
/// reason gives no fingerprint.
#[test]
fn fingerprints_see_what_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let (devices, module) = (dir.path().join("devices"), dir.path().join("version"));
    std::fs::create_dir(&devices).unwrap();
    for name in ["b", "a"] {
        std::fs::write(devices.join(name), "").unwrap();
    }
    std::fs::write(&module, "2.1\n").unwrap();
    let fp = Fingerprint::new().list(&devices);
    assert_eq!(fp.last_listing(), ["a", "b"], "sorted");
    let absent = fp.list(dir.path().join("absent"));
    assert!(absent.last_listing().is_empty(), "absent: no entries");
    let read = || {
        Fingerprint::new()
            .list(&devices)
            .exists(dir.path().join("dev0"))
            .contents(&module)
            .finish()
    };
    let before = read().unwrap();
    assert_eq!(read().unwrap(), before, "nothing changed");

    std::fs::write(devices.join("c"), "").unwrap();
    let added = read().unwrap();
    assert_ne!(added, before, "an entry came");
    std::fs::write(dir.path().join("dev0"), "").unwrap();
    let node = read().unwrap();
    assert_ne!(node, added, "a path appeared");
    std::fs::write(&module, "2.2\n").unwrap();
    assert_ne!(read().unwrap(), node, "the module's version changed");
    std::fs::remove_file(&module).unwrap();
    assert!(read().is_some(), "an absent file is a value");

    // A file where a directory is named cannot be listed: no fingerprint.
    let not_a_dir = Fingerprint::new().list(devices.join("a")).finish();
    assert!(not_a_dir.is_none());
    let unreadable = Fingerprint::new().contents(&devices).finish();
    assert!(unreadable.is_none(), "a directory's contents");
}

/// The held forms read what the path forms read: an entry that comes or
/// goes, a directory that appears, a module version that changes, each
/// changes the fingerprint; nothing changed, nothing does; a listing that
/// fails gives no fingerprint.
#[test]
fn held_fingerprints_see_what_they_name() {
    use crate::held::{HeldFile, HeldListing};
    let dir = tempfile::tempdir().unwrap();
    let (devices, dev, module) = (
        dir.path().join("devices"),
        dir.path().join("infiniband"),
        dir.path().join("version"),
    );
    std::fs::create_dir(&devices).unwrap();
    std::fs::write(devices.join("a"), "").unwrap();
    std::fs::write(&module, "2.1\n").unwrap();
    let mut held = (
        HeldListing::new(&devices),
        HeldListing::new(&dev),
        HeldFile::new(&module),
    );
    let mut read = || {
        Fingerprint::new()
            .listed(&mut held.0)
            .listed(&mut held.1)
            .held_contents(&mut held.2)
            .finish()
    };
    let before = read().unwrap();
    assert_eq!(read().unwrap(), before, "nothing changed");
    std::fs::write(devices.join("b"), "").unwrap();
    let added = read().unwrap();
    assert_ne!(added, before, "an entry came");
    std::fs::create_dir(&dev).unwrap();
    let made = read().unwrap();
    assert_ne!(made, added, "a directory appeared (empty)");
    std::fs::write(dev.join("uverbs0"), "").unwrap();
    let node = read().unwrap();
    assert_ne!(node, made, "a node came");
    // In place, as sysfs shows a new value through the same handle.
    std::fs::write(&module, "2.2\n").unwrap();
    let reloaded = read().unwrap();
    assert_ne!(reloaded, node, "the module's version changed");
    std::fs::remove_file(devices.join("b")).unwrap();
    let gone = read().unwrap();
    assert_eq!(
        gone.parts[0], before.parts[0],
        "the entry went: as at first"
    );
    assert_eq!(gone.parts[1..], reloaded.parts[1..]);

    let mut file = HeldListing::new(&module);
    let not_a_dir = Fingerprint::new().listed(&mut file).finish();
    assert!(not_a_dir.is_none(), "a file where a directory is named");
}
