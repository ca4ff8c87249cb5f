//! Kubernetes resource quantities (`1Gi`, `500m`, `2e3`), parsed and
//! compared exactly: the workspace's one implementation.
//!
//! Two users: dra-core validates the capacities and counters a driver
//! publishes and compares them with what the API server hands back in
//! canonical form (`1024Mi` comes back as `1Gi`; comparing strings would
//! rewrite an unchanged slice forever), and kubectl-dra subtracts counters
//! the way the scheduler does. A crate of its own because neither of those
//! should depend on the other, and `kube-cel` (which has a quantity for CEL)
//! keeps its type private.
//!
//! A quantity is held as an exact integer number of nano-units, the finest
//! precision Kubernetes keeps (it rounds smaller fractions up), so equal
//! values in different spellings compare equal. A value too large for that
//! (beyond about 1.7e29) is refused rather than approximated.

use std::cmp::Ordering;
use std::fmt;

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;

/// A parsed quantity: `nanos` × 10⁻⁹.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("{0:?} is too large for exact comparison")]
    TooLarge(String),
}

impl Quantity {
    pub fn from_int(value: i64) -> Option<Self> {
        i128::from(value)
            .checked_mul(NANO)
            .map(|nanos| Quantity { nanos })
    }

    /// Parses the Kubernetes quantity syntax:
    /// `[+-]digits[.digits][Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|e<int>|E<int>]`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(text.to_string());
        let too_large = || QuantityError::TooLarge(text.to_string());
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = match number.split_once('.') {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(syntax());
        }
        // (base, exponent): multiplier is base^exponent.
        let (base, exponent): (i128, i32) = match suffix {
            "" => (10, 0),
            "n" => (10, -9),
            "u" => (10, -6),
            "m" => (10, -3),
            "k" => (10, 3),
            "M" => (10, 6),
            "G" => (10, 9),
            "T" => (10, 12),
            "P" => (10, 15),
            "E" => (10, 18),
            "Ki" => (2, 10),
            "Mi" => (2, 20),
            "Gi" => (2, 30),
            "Ti" => (2, 40),
            "Pi" => (2, 50),
            "Ei" => (2, 60),
            s if s.starts_with(['e', 'E']) && s.len() > 1 => {
                let exp: i32 = s[1..].parse().map_err(|_| syntax())?;
                (10, exp)
            }
            _ => return Err(syntax()),
        };
        // digits as an integer mantissa, scaled by 10^-(fraction length)
        let mut mantissa: i128 = 0;
        for c in whole.chars().chain(fraction.chars()) {
            let digit = i128::from(c.to_digit(10).ok_or_else(syntax)?);
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(digit))
                .ok_or_else(too_large)?;
        }
        let frac_len = i32::try_from(fraction.len()).map_err(|_| too_large())?;
        // value = mantissa * base^exponent * 10^-frac_len; nanos = value * 10^9
        let (mut numerator, mut denominator): (i128, i128) = (mantissa, 1);
        let pow = |b: i128, e: u32| b.checked_pow(e).ok_or_else(too_large);
        if exponent >= 0 {
            numerator = numerator
                .checked_mul(pow(base, exponent.unsigned_abs())?)
                .ok_or_else(too_large)?;
        } else {
            denominator = pow(base, exponent.unsigned_abs())?;
        }
        let ten_exp = 9 - frac_len;
        if ten_exp >= 0 {
            numerator = numerator
                .checked_mul(pow(10, ten_exp.unsigned_abs())?)
                .ok_or_else(too_large)?;
        } else {
            denominator = denominator
                .checked_mul(pow(10, ten_exp.unsigned_abs())?)
                .ok_or_else(too_large)?;
        }
        // Kubernetes rounds fractions of a nano-unit up (away from zero).
        let mut nanos = numerator / denominator;
        if numerator % denominator != 0 {
            nanos += 1;
        }
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    pub fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    /// The smallest `base + n × step` (`n` a whole number, at least 0) that
    /// is not below `self`: how the scheduler rounds a capacity request up
    /// to a device's `validRange` (`base` its `min`). `None` when `step` is
    /// not positive or the result does not fit.
    pub fn round_up_to_step(self, base: Quantity, step: Quantity) -> Option<Quantity> {
        if step.nanos <= 0 {
            return None;
        }
        let above = self.nanos.checked_sub(base.nanos)?;
        if above <= 0 {
            return Some(base);
        }
        // Both positive here: a ceiling division (i128::div_ceil is unstable).
        let steps = (above - 1) / step.nanos + 1;
        steps
            .checked_mul(step.nanos)
            .and_then(|n| n.checked_add(base.nanos))
            .map(|nanos| Quantity { nanos })
    }

    /// `true` when the value is strictly greater than zero.
    pub fn is_positive(self) -> bool {
        self.nanos > 0
    }

    pub fn sign(self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    pub fn is_integer(self) -> bool {
        self.nanos % NANO == 0 && i64::try_from(self.nanos / NANO).is_ok()
    }

    /// The value as an `int`, when it is a whole number that fits.
    pub fn as_integer(self) -> Option<i64> {
        if self.nanos % NANO != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANO).ok()
    }

    pub fn as_approximate_float(self) -> f64 {
        // Precision loss is what the name promises.
        (self.nanos as f64) / (NANO as f64)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.nanos / NANO;
        let frac = (self.nanos % NANO).abs();
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let sign = if self.nanos < 0 && whole == 0 {
                "-"
            } else {
                ""
            };
            let digits = format!("{frac:09}");
            write!(f, "{sign}{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// `true` when both strings denote the same quantity, or, when either is
/// not a quantity we can hold exactly, when the strings are identical.
pub fn quantities_equal(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (Quantity::parse(a), Quantity::parse(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities() {
        let cases: &[(&str, i128)] = &[
            ("0", 0),
            ("1", NANO),
            ("1Ki", 1024 * NANO),
            ("1Gi", (1 << 30) * NANO),
            ("1.5Gi", 3 * (1 << 29) * NANO),
            ("500m", NANO / 2),
            ("1k", 1000 * NANO),
            ("2e3", 2000 * NANO),
            ("2E3", 2000 * NANO),
            ("1e-3", NANO / 1000),
            ("-2", -2 * NANO),
            ("+2", 2 * NANO),
            ("1n", 1),
            ("0.1n", 1), // rounded up, as Kubernetes does
            (".5", NANO / 2),
            ("100Gi", 100 * (1 << 30) * NANO),
            ("1Ei", (1 << 60) * NANO),
        ];
        for (text, nanos) in cases {
            assert_eq!(
                Quantity::parse(text),
                Ok(Quantity { nanos: *nanos }),
                "{text}"
            );
        }
    }

    #[test]
    fn rounds_up_to_a_step_above_a_base() {
        let q = |s| Quantity::parse(s).unwrap_or_else(|e| panic!("{e}"));
        let (min, step) = (q("5G"), q("5G"));
        for (asked, got) in [
            ("23G", "25G"),
            ("25G", "25G"),
            ("1", "5G"),
            ("5G", "5G"),
            ("100G", "100G"),
            ("101G", "105G"),
        ] {
            assert_eq!(
                q(asked).round_up_to_step(min, step),
                Some(q(got)),
                "{asked}"
            );
        }
        // Steps counted from the base, not from zero.
        assert_eq!(q("4").round_up_to_step(q("1"), q("2")), Some(q("5")));
        assert_eq!(q("1.1").round_up_to_step(q("0"), q("500m")), Some(q("1.5")));
        assert_eq!(q("1").round_up_to_step(q("0"), q("0")), None);
    }

    #[test]
    fn rejects_non_quantities() {
        for text in ["", "Gi", "1GB", "1.2.3", "abc", "1 Gi", "--1", "1e", "1ee2"] {
            assert!(Quantity::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn compares_across_suffixes() {
        let q = |s| Quantity::parse(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q("1Gi").cmp(&q("1G")), Ordering::Greater);
        assert_eq!(q("1000m").cmp(&q("1")), Ordering::Equal);
        assert_eq!(q("1024").cmp(&q("1Ki")), Ordering::Equal);
        assert!(q("1.5").is_integer().eq(&false));
        assert_eq!(q("3k").as_integer(), Some(3000));
        assert_eq!(q("-1m").sign(), -1);
        assert_eq!(q("1500m").to_string(), "1.5");
    }

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
        for (a, b) in [("1Gi", "1G"), ("1", "2"), ("-1", "1"), ("1Ki", "1k")] {
            assert!(!quantities_equal(a, b), "{a} != {b}");
        }
    }

    #[test]
    fn rejects_what_the_api_server_rejects() {
        for s in ["", "Gi", "1.2.3", "1x", " 1", "1 ", "--1", "1e", "1e+", "."] {
            assert!(Quantity::parse(s).is_err(), "{s:?}");
        }
        assert!(Quantity::parse("2").is_ok_and(Quantity::is_positive));
        assert!(Quantity::parse("0").is_ok_and(|q| !q.is_positive()));
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
            let _ = Quantity::parse(&s);
        }
    }
}
