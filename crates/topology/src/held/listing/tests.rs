use super::*;

fn listing(dir: &Path) -> Option<ListingDigest> {
    HeldListing::new(dir).digest().expect("listing")
}

/// A held listing sees entries come and go through its handle, and reads
/// the same digest as a fresh listing of the same directory.
#[test]
fn held_listings_follow_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("devices");
    std::fs::create_dir(&dir).unwrap();
    for name in ["0000:10:00.0", "0000:20:00.0"] {
        std::fs::write(dir.join(name), "").unwrap();
    }
    let mut held = HeldListing::new(&dir);
    let first = held.digest().unwrap().expect("exists");
    assert_eq!(first.entries, 2);
    assert!(held.is_open());
    assert_eq!(
        held.digest().unwrap(),
        Some(first),
        "rewound: the same again"
    );
    assert_eq!(listing(&dir), Some(first), "as a fresh listing");

    std::fs::write(dir.join("0000:30:00.0"), "").unwrap();
    let grown = held.digest().unwrap().expect("exists");
    assert_eq!(grown.entries, 3, "a new entry is seen through the handle");
    assert_ne!(grown.digest, first.digest);
    assert_eq!(listing(&dir), Some(grown));

    std::fs::remove_file(dir.join("0000:30:00.0")).unwrap();
    std::fs::rename(dir.join("0000:20:00.0"), dir.join("0000:21:00.0")).unwrap();
    let renamed = held.digest().unwrap().expect("exists");
    assert_eq!(renamed.entries, 2);
    assert_ne!(renamed.digest, first.digest, "same count, other names");
}

/// A directory removed and created anew under a held handle is listed by
/// its path; an absent one is `None` and opened once it appears; an empty
/// one is listed by path each time.
#[test]
fn removed_and_absent_directories_are_listed_by_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("efa");
    let mut held = HeldListing::new(&dir);
    assert_eq!(held.digest().unwrap(), None, "absent");
    assert!(!held.is_open());

    std::fs::create_dir(&dir).unwrap();
    let empty = held.digest().unwrap().expect("exists now");
    assert_eq!(empty.entries, 0);
    std::fs::write(dir.join("0000:10:00.0"), "").unwrap();
    let one = held.digest().unwrap().expect("exists");
    assert_eq!(one.entries, 1);

    // Removed and made again with other entries: the old handle's
    // directory is gone, the path's is read.
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(held.digest().unwrap(), None, "removed");
    std::fs::create_dir(&dir).unwrap();
    for name in ["0000:20:00.0", "0000:30:00.0"] {
        std::fs::write(dir.join(name), "").unwrap();
    }
    let again = held.digest().unwrap().expect("made again");
    assert_eq!(again.entries, 2);
    assert_eq!(listing(&dir), Some(again));

    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("0000:40:00.0"), "").unwrap();
    assert_eq!(held.digest().unwrap(), listing(&dir), "replaced while held");
}

/// A path that is not a directory cannot be listed: an error, not `None`
/// (a fingerprint that cannot read what it names proves nothing).
#[test]
fn a_file_is_not_a_listing() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("version");
    std::fs::write(&file, "2.10.0\n").unwrap();
    assert!(HeldListing::new(&file).digest().is_err());
}
