//! Exact comparison of Kubernetes quantities (`1Gi`, `1024Mi`, `500m`, `1e3`).
//!
//! The API server re-serialises quantities in canonical form, so a capacity we
//! published as `1024Mi` comes back as `1Gi`. Comparing the strings would make
//! the publisher rewrite an unchanged slice forever; comparing exact values does
//! not. Values are held as `mantissa × 10^exp10 × 2^exp2` and compared without
//! rounding. This is deliberately only a comparator and a validity check, not a
//! full quantity library.

use std::cmp::Ordering;

/// A parsed quantity: `mantissa × 10^exp10 × 2^exp2`, mantissa with sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuantityValue {
    mantissa: i128,
    exp10: i32,
    exp2: i32,
}

impl QuantityValue {
    /// Parses the Kubernetes quantity grammar (`<signedNumber><suffix>`).
    /// Returns `None` for anything the API server would reject, or numbers too
    /// large to hold exactly.
    pub(crate) fn parse(input: &str) -> Option<Self> {
        let s = input.trim();
        if s.is_empty() || s != input {
            return None;
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let mut mantissa: i128 = 0;
        for b in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)?
                .checked_add(i128::from(b - b'0'))?;
        }
        let mut exp10 = -i32::try_from(frac_part.len()).ok()?;
        let mut exp2 = 0;
        match suffix {
            "" => {}
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            other => {
                let exp = other.strip_prefix(['e', 'E'])?;
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                exp10 = exp10.checked_add(exp.parse::<i32>().ok()?)?;
            }
        }
        if negative {
            mantissa = -mantissa;
        }
        Some(Self {
            mantissa,
            exp10,
            exp2,
        })
    }

    /// `true` when the value is strictly greater than zero.
    pub(crate) fn is_positive(&self) -> bool {
        self.mantissa > 0
    }

    /// Exact comparison; `None` when the numbers cannot be brought to a common
    /// scale without overflowing (then callers fall back to string equality).
    pub(crate) fn exact_cmp(&self, other: &Self) -> Option<Ordering> {
        let (mut a, mut b) = (self.mantissa, other.mantissa);
        // Bring both to the smaller exponents by multiplying the other side up.
        let e10 = self.exp10.min(other.exp10);
        let e2 = self.exp2.min(other.exp2);
        a = scale(a, self.exp10 - e10, self.exp2 - e2)?;
        b = scale(b, other.exp10 - e10, other.exp2 - e2)?;
        Some(a.cmp(&b))
    }
}

fn scale(mut v: i128, by10: i32, by2: i32) -> Option<i128> {
    for _ in 0..by10 {
        v = v.checked_mul(10)?;
    }
    for _ in 0..by2 {
        v = v.checked_mul(2)?;
    }
    Some(v)
}

/// `true` when both strings denote the same quantity (exactly), or, if either
/// cannot be parsed or compared, when the strings are identical.
pub(crate) fn quantities_equal(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (QuantityValue::parse(a), QuantityValue::parse(b)) {
        (Some(x), Some(y)) => x.exact_cmp(&y) == Some(Ordering::Equal),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_quantities_in_different_spellings() {
        for (a, b) in [
            ("1Gi", "1024Mi"),
            ("1k", "1000"),
            ("0.5", "500m"),
            ("1e3", "1k"),
            ("1E-3", "1m"),
            ("128Gi", "137438953472"),
            ("0", "0m"),
            ("+4", "4"),
        ] {
            assert!(quantities_equal(a, b), "{a} == {b}");
        }
    }

    #[test]
    fn different_quantities() {
        for (a, b) in [("1Gi", "1G"), ("1", "2"), ("-1", "1"), ("1Ki", "1k")] {
            assert!(!quantities_equal(a, b), "{a} != {b}");
        }
    }

    #[test]
    fn rejects_malformed() {
        for s in ["", "Gi", "1.2.3", "1x", " 1", "1 ", "--1", "1e", "1e+", "."] {
            assert_eq!(QuantityValue::parse(s), None, "{s:?}");
        }
        assert!(QuantityValue::parse("2").is_some_and(|q| q.is_positive()));
        assert!(QuantityValue::parse("0").is_some_and(|q| !q.is_positive()));
    }

    proptest::proptest! {
        #[test]
        fn binary_and_decimal_spellings_agree(n in 0u32..1_000_000) {
            let ki = format!("{n}Ki");
            let plain = format!("{}", u64::from(n) * 1024);
            proptest::prop_assert!(quantities_equal(&ki, &plain));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,16}") {
            let _ = QuantityValue::parse(&s);
        }
    }
}
