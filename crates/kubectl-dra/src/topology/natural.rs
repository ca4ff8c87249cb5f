//! Device names in the order people count them.

/// Digit runs as numbers, the rest as text: see [`natural_key`].
pub(super) type NaturalKey = Vec<(u8, u64, String)>;

/// Natural order for names like `efa-0000-4f-00-0` and `neurondevice10`:
/// digit runs compare as numbers.
pub(super) fn natural_key(s: &str) -> NaturalKey {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        let mut run = String::new();
        let digits = c.is_ascii_digit();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_digit() != digits {
                break;
            }
            run.push(c);
            chars.next();
        }
        if digits {
            out.push((0, run.parse().unwrap_or(u64::MAX), run));
        } else {
            out.push((1, 0, run));
        }
    }
    out
}
