//! Claim UIDs from kubelet become file names (the claim's CDI spec) and
//! checkpoint keys, so one is checked before anything else happens to it.
//!
//! The API server gives every object a UID in the textual form of RFC 4122
//! (`8-4-4-4-12` hex digits, 36 characters; Kubernetes writes them in lower
//! case, and RFC 4122 reads either case), and kubelet passes the claim's UID
//! through unchanged. Nothing else is accepted: no path separator, dot or
//! other character can reach a file name, whatever a client sends.

/// Positions of the hyphens in the textual form.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];
/// Length of the textual form.
const LEN: usize = 36;

/// `Ok` for a UID in the textual form of RFC 4122; otherwise why not, in
/// words for the gRPC error.
pub(crate) fn check_claim_uid(uid: &str) -> Result<(), String> {
    let bytes = uid.as_bytes();
    let shaped = bytes.len() == LEN
        && bytes.iter().enumerate().all(|(i, b)| {
            if HYPHENS.contains(&i) {
                *b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    if shaped {
        Ok(())
    } else {
        Err(format!(
            "claim UID {:?} is not a Kubernetes UID (RFC 4122 text: 8-4-4-4-12 hex digits)",
            uid.chars().take(64).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::check_claim_uid;

    #[test]
    fn only_the_rfc_4122_text_form_passes() {
        for good in [
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c11",
            "0B7C6A58-2F3E-4F7E-9D55-0A4F0F5F1C11",
            "00000000-0000-0000-0000-000000000000",
        ] {
            assert_eq!(check_claim_uid(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "uid-1",
            "../../etc/passwd",
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c1",
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c111",
            "0b7c6a582f3e4f7e9d550a4f0f5f1c11",
            "0b7c6a58-2f3e-4f7e-9d55_0a4f0f5f1c11",
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c1g",
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f/c11",
            "{0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c1}",
            "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c1\u{e9}",
        ] {
            let err = check_claim_uid(bad).unwrap_err();
            assert!(err.contains("not a Kubernetes UID"), "{bad}: {err}");
        }
    }
}
