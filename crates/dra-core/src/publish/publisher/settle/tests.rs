use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn slice(name: &str, uid: &str, rv: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn seen(slices: &[ResourceSlice]) -> Vec<Arc<ResourceSlice>> {
    slices.iter().cloned().map(Arc::new).collect()
}

/// `name@rv` of each slice in a view, sorted.
fn shown(view: &[ResourceSlice]) -> Vec<String> {
    let mut out: Vec<String> = view
        .iter()
        .map(|s| {
            format!(
                "{}@{}",
                name(s),
                s.metadata.resource_version.as_deref().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(start_paused = true)]
async fn own_writes_fill_in_what_the_watch_has_not_shown() {
    let now = Instant::now();
    let mut own = OwnWrites::default();
    own.wrote(&slice("a", "u1", "10"), now);
    own.wrote(&slice("b", "u2", "11"), now);
    own.deleted("c", Some("u3".into()), now);
    // The watch still shows an older `b` and the deleted `c`, not `a`.
    let stale = seen(&[slice("b", "u2", "7"), slice("c", "u3", "8")]);
    assert_eq!(shown(&own.view(&stale)), ["a@10", "b@11"]);
    // Events older than our writes change nothing...
    own.observe(&slice("a", "u1", "9"), false);
    own.observe(&slice("c", "u3", "9"), false);
    own.settle(&stale);
    assert_eq!(shown(&own.view(&stale)), ["a@10", "b@11"]);
    // ... ours and newer ones settle their entries.
    own.observe(&slice("a", "u1", "10"), false);
    own.observe(&slice("b", "u2", "15"), false);
    own.observe(&slice("c", "u3", "16"), true);
    assert!(own.is_empty());
    let caught_up = seen(&[slice("a", "u1", "10"), slice("b", "u2", "15")]);
    assert_eq!(shown(&own.view(&caught_up)), ["a@10", "b@15"]);
}

#[tokio::test(start_paused = true)]
async fn a_view_that_caught_up_settles_without_events() {
    let now = Instant::now();
    let mut own = OwnWrites::default();
    own.wrote(&slice("a", "u1", "10"), now);
    own.deleted("c", Some("u3".into()), now);
    own.wrote(&slice("d", "u4", "12"), now);
    // A relist: `a` at a newer version (someone edited it), `c` gone,
    // `d` not yet there.
    let relisted = seen(&[slice("a", "u1", "20")]);
    own.settle(&relisted);
    assert_eq!(shown(&own.view(&relisted)), ["a@20", "d@12"]);
    assert_eq!(own.due(now), Vec::<String>::new());
    assert_eq!(own.next_check(), Some(now + WRITE_SETTLE_TIMEOUT));
}

#[tokio::test(start_paused = true)]
async fn someone_elses_delete_or_recreate_reaches_the_view() {
    let now = Instant::now();
    let mut own = OwnWrites::default();
    own.wrote(&slice("a", "u1", "10"), now);
    own.observe(&slice("a", "u1", "12"), true);
    assert!(own.is_empty());
    // Recreated after our delete: another UID under the name.
    own.deleted("b", Some("u2".into()), now);
    own.observe(&slice("b", "u2", "13"), false);
    assert!(!own.is_empty(), "an update of the deleted object is older");
    own.observe(&slice("b", "u9", "14"), false);
    assert!(own.is_empty());
    // Opaque versions: any event of the name settles.
    own.wrote(&slice("x", "u5", "v-a"), now);
    own.observe(&slice("x", "u5", "v-b"), false);
    assert!(own.is_empty());
}

#[tokio::test(start_paused = true)]
async fn unsettled_writes_are_read_back_less_and_less_often() {
    let start = Instant::now();
    let mut own = OwnWrites::default();
    own.wrote(&slice("a", "u1", "10"), start);
    own.wrote(&slice("b", "u2", "11"), start);
    assert!(own.due(start).is_empty());
    let t1 = start + WRITE_SETTLE_TIMEOUT;
    assert_eq!(own.due(t1), ["a", "b"]);
    // The read finds `a` as we wrote it (the watch is still behind) and `b`
    // gone (deleted while the watch was away; the view still shows it).
    let view = seen(&[slice("b", "u2", "11")]);
    own.read_back("a", Some(slice("a", "u1", "10")), None, t1);
    own.read_back("b", None, Some(&slice("b", "u2", "11")), t1);
    assert_eq!(shown(&own.view(&view)), ["a@10"]);
    assert_eq!(own.next_check(), Some(t1 + 2 * WRITE_SETTLE_TIMEOUT));
    let mut t = t1;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let next = own.next_check().expect("still unsettled");
        waits.push((next - t).as_secs());
        t = next;
        own.read_back("a", Some(slice("a", "u1", "10")), None, t);
        own.read_back("b", None, Some(&slice("b", "u2", "11")), t);
    }
    assert_eq!(waits, [20, 40, 80, 160, 160, 160]);
    // A read the watch already shows settles the entry.
    own.read_back(
        "a",
        Some(slice("a", "u1", "10")),
        Some(&slice("a", "u1", "10")),
        t,
    );
    // Gone, and gone from the view too.
    own.read_back("b", None, None, t);
    assert!(own.is_empty());
}
