//! The relay's output as the server reads it, for the targets that check
//! it (`authority`, `relay_connection`): the connection preface, then whole
//! frames no larger than the server accepts. Included by each with
//! `#[path = "common/relay_output.rs"] mod relay_output;`.

use dra_core::fuzzing::{Frame, MAX_IN_FRAME, PREFACE, parse_frame};

/// The frames of `out` after the preface; panics where `out` is not that.
pub fn frames_after_preface(out: &[u8]) -> Vec<Frame> {
    assert_eq!(
        &out[..PREFACE.len()],
        PREFACE,
        "output starts with the preface"
    );
    let mut rest = &out[PREFACE.len()..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let (frame, used) = parse_frame(rest)
            .expect("output frames are within the size limit")
            .expect("output holds whole frames only");
        assert!(frame.payload.len() <= MAX_IN_FRAME);
        rest = &rest[used..];
        frames.push(frame);
    }
    frames
}
