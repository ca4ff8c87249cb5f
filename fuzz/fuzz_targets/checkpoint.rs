//! Checkpoint loading from whatever is in the file (a torn write, another
//! version, a hand edit): never a panic; a file that is not a checkpoint of
//! this boot loads as empty, and a corrupt one (moved aside only by the
//! pipeline's read under the data-dir lock) and a newer version's are
//! refused and left exactly as they were.
#![no_main]

use std::path::{Component, Path};
use std::sync::OnceLock;

use dra_core::fuzzing::PluginMetrics;
use dra_core::fuzzing::{Checkpoint, CheckpointError, CheckpointStore};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    dir: tempfile::TempDir,
    store: CheckpointStore,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir for the fuzz checkpoint");
        let boot_id = dir.path().join("boot_id");
        std::fs::write(&boot_id, "boot-1\n").expect("boot id");
        let metrics = PluginMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let store = CheckpointStore::new(dir.path(), boot_id, dir.path().to_path_buf(), metrics);
        Fixture { dir, store }
    })
}

fn outside(path: &Path, dir: &Path) -> bool {
    !path.starts_with(dir) || path.components().any(|c| c == Component::ParentDir)
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    // A checkpoint from another boot makes the locked read remove the CDI
    // specs it names: never let the fuzzer name files outside its own
    // directory (should `load` ever do it too).
    if let Ok(checkpoint) = serde_json::from_slice::<Checkpoint>(data)
        && checkpoint
            .claims
            .values()
            .any(|c| outside(&c.cdi_spec_path, f.dir.path()))
    {
        return;
    }
    std::fs::write(f.store.path(), data).expect("writing the checkpoint");
    match f.store.load() {
        Ok(loaded) => assert!(loaded.boot_id == "boot-1"),
        Err(CheckpointError::Newer { .. } | CheckpointError::Corrupt { .. }) => {
            let kept = std::fs::read(f.store.path()).expect("a refused checkpoint stays");
            assert!(kept == data, "a refused checkpoint was changed");
        }
        Err(e) => panic!("loading failed on content: {e}"),
    }
    // Leave the directory as it was: corrupt files moved aside pile up.
    for entry in std::fs::read_dir(f.dir.path()).expect("listing the data dir") {
        let path = entry.expect("dir entry").path();
        if path.to_string_lossy().contains(".corrupt-") {
            let _ = std::fs::remove_file(path);
        }
    }
});
