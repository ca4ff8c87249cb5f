use super::*;

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// What a stale handle fails with sends the read back to the path; what the
/// device answers (EIO) and what the caller may not do (EACCES) do not.
#[test]
fn stale_errors_are_told_from_the_device_answers() {
    for stale in [Errno::ENODEV, Errno::ESTALE, Errno::ENOENT] {
        assert!(is_stale(&errno(stale)), "{stale}");
    }
    for answer in [Errno::EIO, Errno::EACCES, Errno::EISDIR, Errno::EAGAIN] {
        assert!(!is_stale(&errno(answer)), "{answer}");
    }
}

#[test]
fn counters_parse_as_sysfs_writes_them() {
    let cases: &[(&[u8], Option<u64>)] = &[
        (b"0\n", Some(0)),
        (b"18446744073709551615\n", Some(u64::MAX)),
        (b"18446744073709551616\n", None),
        (b" 7 ", Some(7)),
        (b"", None),
        (b"-1\n", None),
        (b"\xff\n", None),
    ];
    for (bytes, want) in cases {
        assert_eq!(parse_counter(bytes), *want, "{bytes:?}");
    }
    assert_eq!(parse_counter(&[b'1'; COUNTER_BYTES]), None, "too long");
}

/// A held file is read again on every call (a value written in place is
/// seen, as sysfs runs `show` again for a `pread` at 0); an absent one is
/// not reported and opened as soon as it appears.
#[test]
fn held_files_are_fresh_and_absent_ones_are_opened_when_they_appear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counter");
    let mut held = HeldFile::new(&path);
    assert_eq!(held.read_u64().unwrap(), None, "absent: not reported");
    assert!(!held.is_open());

    std::fs::write(&path, "5\n").unwrap();
    assert_eq!(held.read_u64().unwrap(), Some(5), "appeared");
    assert!(held.is_open());
    std::fs::write(&path, "6\n").unwrap();
    assert_eq!(held.read_u64().unwrap(), Some(6), "read again");
    std::fs::write(&path, "x".repeat(100)).unwrap();
    assert_eq!(held.read_u64().unwrap(), None, "not a counter");
    std::fs::write(&path, "hbm, link_efa\n").unwrap();
    assert_eq!(
        held.read_text().unwrap().as_deref(),
        Some("hbm, link_efa\n")
    );
}

/// The kernel removed the attribute and made a new one (a driver reload):
/// the held handle fails with ENODEV, is dropped, and the path is read once;
/// its new handle is held for the next read.
#[test]
fn a_stale_handle_is_dropped_and_the_replaced_file_read_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counter");
    std::fs::write(&path, "1\n").unwrap();
    let mut held = HeldFile::new(&path);
    assert_eq!(held.read_u64().unwrap(), Some(1));
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "2\n").unwrap();

    // Through the old handle a regular file still reads as it was; sysfs
    // fails it, as this `pread` does for the handle opened first.
    let mut calls = 0;
    let mut buf = [0u8; 16];
    let read = held
        .read_with(&mut buf, |file, buf| {
            calls += 1;
            if calls == 1 {
                Err(errno(Errno::ENODEV))
            } else {
                file.read_at(buf, 0)
            }
        })
        .unwrap();
    assert_eq!(read, Some(&b"2\n"[..]), "the new file, by path");
    assert_eq!(calls, 2, "one read by path");
    assert!(held.is_open(), "the new handle held");
    std::fs::write(&path, "3\n").unwrap();
    assert_eq!(held.read_u64().unwrap(), Some(3), "through the new handle");
}

/// The attribute was removed for good (hot removal): not reported, nothing
/// held, and seen again when it comes back.
#[test]
fn a_stale_handle_of_a_removed_file_reads_as_absent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counter");
    std::fs::write(&path, "1\n").unwrap();
    let mut held = HeldFile::new(&path);
    assert_eq!(held.read_u64().unwrap(), Some(1));
    std::fs::remove_file(&path).unwrap();
    let mut buf = [0u8; 16];
    let read = held.read_with(&mut buf, |_, _| Err(errno(Errno::ESTALE)));
    assert_eq!(read.unwrap(), None);
    assert!(!held.is_open());
    std::fs::write(&path, "4\n").unwrap();
    assert_eq!(held.read_u64().unwrap(), Some(4));
}

/// Another error is the device's answer: returned as it came, the handle
/// kept, the path not tried (it would ask the same device again).
#[test]
fn device_errors_are_returned_and_the_handle_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counter");
    std::fs::write(&path, "1\n").unwrap();
    let mut held = HeldFile::new(&path);
    assert_eq!(held.read_u64().unwrap(), Some(1));
    let mut calls = 0;
    let mut buf = [0u8; 16];
    let err = held
        .read_with(&mut buf, |_, _| {
            calls += 1;
            Err(errno(Errno::EIO))
        })
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(Errno::EIO as i32));
    assert_eq!(calls, 1, "no second read by path");
    assert!(held.is_open());
    assert_eq!(held.read_u64().unwrap(), Some(1), "and it reads again");

    // A real one: what the fixtures put in place of an unreadable counter
    // (a directory, whose read fails with EISDIR) on a first open.
    let unreadable = dir.path().join("unreadable");
    std::fs::create_dir(&unreadable).unwrap();
    let err = HeldFile::new(&unreadable).read_u64().unwrap_err();
    assert!(!is_stale(&err), "{err}");
}
