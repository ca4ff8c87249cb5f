//! Consumable capacity (`DRAConsumableCapacity`): a device published with
//! `allowMultipleAllocations` serves many claims at once, each consuming a
//! part of its capacities, as long as the parts add up to no more than the
//! device has. This is the scheduler's arithmetic, so that `explain` keeps a
//! claim Pending exactly where kube-scheduler does:
//!
//! - a request that names a capacity the device does not have never gets it;
//! - per capacity, a request consumes what it asks for, rounded up to the
//!   device's `validRange` (from `min` in `step`s) or to the next of its
//!   `validValues`; a request that asks for nothing consumes the policy's
//!   `default`, or the whole capacity when there is none;
//! - the amount must then keep to the policy (at most `max`, on a step, one
//!   of the values; the `default` always does), and fit in what the
//!   allocated claims left: their `consumedCapacity` counts against it.

use std::sync::Arc;

use k8s_quantity::Quantity;

use crate::slices::ConsumableCapacity;

/// Why a request gets no share of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// The request asks for a capacity the device does not publish.
    Undefined(String),
    /// What the request would consume breaks the capacity's request policy.
    OutsidePolicy { capacity: String, amount: Quantity },
    /// Not enough of the capacity is left.
    NotEnough {
        capacity: String,
        need: Quantity,
        left: Quantity,
    },
}

/// `q` with the largest decimal suffix that keeps it whole (`25G`, not
/// `25000000000`), as capacities are written.
pub fn readable(q: Quantity) -> String {
    const SUFFIXES: [(&str, i64); 6] = [
        ("E", 1_000_000_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("T", 1_000_000_000_000),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
        ("k", 1_000),
    ];
    match q.as_integer().filter(|i| *i != 0) {
        Some(i) => SUFFIXES
            .iter()
            .find(|(_, f)| i % f == 0)
            .map_or_else(|| i.to_string(), |(s, f)| format!("{}{s}", i / f)),
        None => q.to_string(),
    }
}

/// What a request asking for `requested` (`None`: nothing) consumes of `c`.
pub fn consumed(requested: Option<Quantity>, c: &ConsumableCapacity) -> Quantity {
    let Some(asked) = requested else {
        return c.default.unwrap_or(c.value);
    };
    if let Some((min, _, step)) = c.range {
        if asked < min {
            return min;
        }
        return match step {
            Some(step) => asked.round_up_to_step(min, step).unwrap_or(asked),
            None => asked,
        };
    }
    c.valid_values
        .iter()
        .copied()
        .find(|v| asked <= *v)
        .unwrap_or(asked)
}

/// Whether consuming `amount` breaks `c`'s request policy.
fn violates(amount: Quantity, c: &ConsumableCapacity) -> bool {
    if c.default == Some(amount) {
        return false;
    }
    if let Some((min, max, step)) = c.range {
        let above_max = max.is_some_and(|m| amount > m);
        let off_step = step.is_some_and(|s| amount.round_up_to_step(min, s) != Some(amount));
        return above_max || off_step;
    }
    !c.valid_values.is_empty() && !c.valid_values.contains(&amount)
}

/// What a request asking for `requests` consumes of a shared device with
/// capacities `device`, where `used(name)` is what allocated claims already
/// consume of each (`None`: nothing); or why it cannot have a share.
pub fn share(
    requests: &[(String, Quantity)],
    device: &[(Arc<str>, ConsumableCapacity)],
    used: impl Fn(&str) -> Option<Quantity>,
) -> Result<Vec<(Arc<str>, Quantity)>, Shortfall> {
    if let Some((name, _)) = requests
        .iter()
        .find(|(name, _)| !device.iter().any(|(n, _)| **n == **name))
    {
        return Err(Shortfall::Undefined(name.clone()));
    }
    let mut out = Vec::with_capacity(device.len());
    for (name, c) in device {
        let asked = requests.iter().find(|(n, _)| **n == **name).map(|r| r.1);
        let amount = consumed(asked, c);
        if violates(amount, c) {
            return Err(Shortfall::OutsidePolicy {
                capacity: name.to_string(),
                amount,
            });
        }
        let left = match used(name) {
            Some(u) => c.value.checked_sub(u).unwrap_or(c.value),
            None => c.value,
        };
        if amount > left {
            return Err(Shortfall::NotEnough {
                capacity: name.to_string(),
                need: amount,
                left,
            });
        }
        out.push((name.clone(), amount));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A 100G EFA as the EFA driver publishes it for sharing: a quarter by
    /// default, from 5G to 100G in 5G steps.
    fn efa() -> Vec<(Arc<str>, ConsumableCapacity)> {
        vec![(
            Arc::from("bandwidth"),
            ConsumableCapacity {
                value: q("100G"),
                default: Some(q("25G")),
                valid_values: vec![],
                range: Some((q("5G"), Some(q("100G")), Some(q("5G")))),
            },
        )]
    }

    #[test]
    fn requests_round_up_to_the_policy() {
        let c = &efa()[0].1;
        assert_eq!(consumed(None, c), q("25G"));
        assert_eq!(consumed(Some(q("23G")), c), q("25G"));
        assert_eq!(consumed(Some(q("1")), c), q("5G"));
        assert_eq!(consumed(Some(q("100G")), c), q("100G"));
        let values = ConsumableCapacity {
            value: q("8"),
            default: None,
            valid_values: vec![q("2"), q("4")],
            range: None,
        };
        assert_eq!(consumed(None, &values), q("8"), "no default: all of it");
        assert_eq!(consumed(Some(q("3")), &values), q("4"));
        assert!(violates(q("5"), &values));
        assert!(!violates(q("4"), &values));
        assert_eq!(readable(q("25G")), "25G");
        assert_eq!(readable(q("1.5T")), "1500G");
        assert_eq!(readable(q("0")), "0");
        assert_eq!(readable(q("1500m")), "1.5");
    }

    #[test]
    fn four_default_shares_fill_an_efa_and_a_fifth_waits() {
        let device = efa();
        let mut used = None;
        for _ in 0..4 {
            let got = share(&[], &device, |_| used).unwrap();
            assert_eq!(got, vec![(Arc::from("bandwidth"), q("25G"))]);
            used = Some(used.map_or(got[0].1, |u: Quantity| u.checked_add(got[0].1).unwrap()));
        }
        assert_eq!(
            share(&[], &device, |_| used),
            Err(Shortfall::NotEnough {
                capacity: "bandwidth".into(),
                need: q("25G"),
                left: q("0"),
            })
        );
        // 23G takes a 25G share: it does not fit in 20G either.
        let asked = [("bandwidth".to_string(), q("23G"))];
        assert!(matches!(
            share(&asked, &device, |_| Some(q("80G"))),
            Err(Shortfall::NotEnough { .. })
        ));
        assert!(share(&asked, &device, |_| Some(q("75G"))).is_ok());
    }

    #[test]
    fn requests_outside_the_device_get_no_share() {
        let device = efa();
        let too_much = [("bandwidth".to_string(), q("150G"))];
        assert_eq!(
            share(&too_much, &device, |_| None),
            Err(Shortfall::OutsidePolicy {
                capacity: "bandwidth".into(),
                amount: q("150G"),
            })
        );
        let unknown = [("memory".to_string(), q("1Gi"))];
        assert_eq!(
            share(&unknown, &device, |_| None),
            Err(Shortfall::Undefined("memory".into()))
        );
    }
}
