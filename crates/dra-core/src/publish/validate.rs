//! Client-side validation of devices against the API server's limits.
//!
//! One invalid attribute makes the API server reject the whole ResourceSlice,
//! and with it every healthy device of the node. So before publishing we check
//! each device against the limits of `resource.k8s.io/v1` (Kubernetes 1.34) and
//! repair what we can: an over-long string is shortened, an attribute or capacity
//! that cannot be repaired is dropped, and only a device whose *name* is invalid
//! (or duplicated) is dropped as a whole. Every repair is reported as a
//! [`ValidationIssue`]; the caller logs and counts them (this module is pure).
//!
//! Limits enforced (see `docs/` and the resource API reference):
//! device name a DNS label (≤ 63); attribute and capacity names an optional
//! DNS-subdomain domain (≤ 63) + `/` + C identifier (≤ 32); exactly one of
//! `bool`/`int`/`string`/`version`; string and version values ≤ 64 bytes;
//! version values SemVer 2.0; ≤ 32 attributes + capacities per device;
//! capacity values valid quantities. Names are unique once qualified with the
//! driver's domain (`foo` and `<driver>/foo` are the same attribute).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

/// Longest string or version attribute value the API server accepts, in bytes.
pub(crate) const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Most attributes plus capacities one device may carry.
pub(crate) const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Longest identifier part of an attribute or capacity name.
pub(crate) const MAX_IDENTIFIER_LEN: usize = 32;
/// Longest domain part of an attribute or capacity name.
pub(crate) const MAX_NAME_DOMAIN_LEN: usize = 63;
/// Longest device name (a DNS label).
pub(crate) const MAX_DEVICE_NAME_LEN: usize = 63;

/// What validation did about a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IssueAction {
    /// The whole device was left out of the pool.
    DeviceDropped,
    /// One attribute was left out; the device is published without it.
    AttributeDropped,
    /// One string attribute was cut to [`MAX_ATTRIBUTE_VALUE_LEN`] bytes.
    AttributeShortened,
    /// One capacity entry was left out.
    CapacityDropped,
}

impl IssueAction {
    /// Stable label value for metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::DeviceDropped => "device_dropped",
            Self::AttributeDropped => "attribute_dropped",
            Self::AttributeShortened => "attribute_shortened",
            Self::CapacityDropped => "capacity_dropped",
        }
    }
}

/// Why validation acted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IssueReason {
    /// Device name is not a DNS label of at most 63 characters.
    InvalidDeviceName,
    /// Another device earlier in the list has the same name.
    DuplicateDeviceName,
    /// Attribute/capacity name is not `[domain/]identifier` within the limits.
    InvalidName(&'static str),
    /// Same name as an earlier entry once qualified with the driver domain.
    DuplicateName,
    /// An attribute with no value set.
    NoValue,
    /// An attribute with more than one of bool/int/string/version set.
    MultipleValues,
    /// String value longer than the limit (carries the original length in bytes).
    ValueTooLong(usize),
    /// Version value that is not SemVer 2.0.
    InvalidVersion,
    /// Version value longer than the limit (cannot be shortened and stay SemVer).
    VersionTooLong(usize),
    /// Capacity value that is not a Kubernetes quantity.
    InvalidQuantity,
    /// Entry beyond the [`MAX_ATTRIBUTES_AND_CAPACITIES`] limit.
    TooManyEntries,
}

impl IssueReason {
    /// Stable label value for metrics.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::InvalidDeviceName => "invalid_device_name",
            Self::DuplicateDeviceName => "duplicate_device_name",
            Self::InvalidName(_) => "invalid_name",
            Self::DuplicateName => "duplicate_name",
            Self::NoValue => "no_value",
            Self::MultipleValues => "multiple_values",
            Self::ValueTooLong(_) => "value_too_long",
            Self::InvalidVersion => "invalid_version",
            Self::VersionTooLong(_) => "version_too_long",
            Self::InvalidQuantity => "invalid_quantity",
            Self::TooManyEntries => "too_many_entries",
        }
    }
}

impl fmt::Display for IssueReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidDeviceName => write!(
                f,
                "device name must be a DNS label (lowercase alphanumerics and '-', at most {MAX_DEVICE_NAME_LEN})"
            ),
            Self::DuplicateDeviceName => write!(f, "device name used by an earlier device"),
            Self::InvalidName(why) => write!(f, "invalid name: {why}"),
            Self::DuplicateName => {
                write!(f, "same name as an earlier entry in the driver's domain")
            }
            Self::NoValue => write!(
                f,
                "no value set (need exactly one of bool, int, string, version)"
            ),
            Self::MultipleValues => {
                write!(
                    f,
                    "more than one value set (need exactly one of bool, int, string, version)"
                )
            }
            Self::ValueTooLong(len) => {
                write!(
                    f,
                    "string value of {len} bytes exceeds {MAX_ATTRIBUTE_VALUE_LEN}"
                )
            }
            Self::InvalidVersion => write!(f, "version value is not SemVer 2.0"),
            Self::VersionTooLong(len) => {
                write!(
                    f,
                    "version value of {len} bytes exceeds {MAX_ATTRIBUTE_VALUE_LEN}"
                )
            }
            Self::InvalidQuantity => write!(f, "capacity value is not a valid quantity"),
            Self::TooManyEntries => write!(
                f,
                "more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities on one device"
            ),
        }
    }
}

/// One repair made by [`validate_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidationIssue {
    /// Device name as the driver gave it.
    pub device: String,
    /// Attribute or capacity name, when the issue is about one.
    pub entry: Option<String>,
    /// What was done.
    pub action: IssueAction,
    /// Why.
    pub reason: IssueReason,
}

impl fmt::Display for ValidationIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {:?}", self.device)?;
        if let Some(entry) = &self.entry {
            write!(f, " entry {entry:?}")?;
        }
        write!(f, ": {}: {}", self.action.as_str(), self.reason)
    }
}

/// Logs each issue as one `warn` line with structured fields.
pub(crate) fn log_issues(issues: &[ValidationIssue]) {
    for issue in issues {
        tracing::warn!(
            device = %issue.device,
            entry = issue.entry.as_deref().unwrap_or(""),
            action = issue.action.as_str(),
            reason = issue.reason.as_str(),
            "{}",
            issue.reason
        );
    }
}

/// Validates and repairs `devices` for publishing by `driver`. Device order is
/// kept; devices with an invalid or duplicate name are left out.
pub(crate) fn validate_devices(
    driver: &str,
    devices: &[Device],
) -> (Vec<Device>, Vec<ValidationIssue>) {
    let mut issues = Vec::new();
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(devices.len());
    for device in devices {
        if !is_dns_label(&device.name) {
            issues.push(issue(
                device,
                None,
                IssueAction::DeviceDropped,
                IssueReason::InvalidDeviceName,
            ));
            continue;
        }
        if !seen.insert(device.name.clone()) {
            issues.push(issue(
                device,
                None,
                IssueAction::DeviceDropped,
                IssueReason::DuplicateDeviceName,
            ));
            continue;
        }
        out.push(validate_device(driver, device, &mut issues));
    }
    (out, issues)
}

fn issue(
    device: &Device,
    entry: Option<&str>,
    action: IssueAction,
    reason: IssueReason,
) -> ValidationIssue {
    ValidationIssue {
        device: device.name.clone(),
        entry: entry.map(str::to_owned),
        action,
        reason,
    }
}

fn validate_device(driver: &str, device: &Device, issues: &mut Vec<ValidationIssue>) -> Device {
    let mut qualified_seen = BTreeSet::new();
    let mut budget = MAX_ATTRIBUTES_AND_CAPACITIES;

    let mut attributes = BTreeMap::new();
    for (name, attr) in device.attributes.iter().flatten() {
        let dropped = |reason| issue(device, Some(name), IssueAction::AttributeDropped, reason);
        let qualified = match qualified_name(driver, name) {
            Ok(q) => q,
            Err(why) => {
                issues.push(dropped(IssueReason::InvalidName(why)));
                continue;
            }
        };
        let value = match check_attribute_value(attr) {
            Ok(v) => v,
            Err(reason) => {
                issues.push(dropped(reason));
                continue;
            }
        };
        if !qualified_seen.insert(qualified) {
            issues.push(dropped(IssueReason::DuplicateName));
            continue;
        }
        if budget == 0 {
            issues.push(dropped(IssueReason::TooManyEntries));
            continue;
        }
        budget -= 1;
        let value = match value {
            CheckedValue::Ok => attr.clone(),
            CheckedValue::Shortened(s, original_len) => {
                issues.push(issue(
                    device,
                    Some(name),
                    IssueAction::AttributeShortened,
                    IssueReason::ValueTooLong(original_len),
                ));
                DeviceAttribute {
                    string: Some(s),
                    ..Default::default()
                }
            }
        };
        attributes.insert(name.clone(), value);
    }

    let mut capacity = BTreeMap::new();
    for (name, cap) in device.capacity.iter().flatten() {
        let dropped = |reason| issue(device, Some(name), IssueAction::CapacityDropped, reason);
        let qualified = match qualified_name(driver, name) {
            Ok(q) => q,
            Err(why) => {
                issues.push(dropped(IssueReason::InvalidName(why)));
                continue;
            }
        };
        // Too large to hold exactly is still a quantity to the API server.
        if let Err(k8s_quantity::QuantityError::Syntax(_)) =
            k8s_quantity::Quantity::parse(&cap.value.0)
        {
            issues.push(dropped(IssueReason::InvalidQuantity));
            continue;
        }
        // Capacities have their own namespace in CEL (`device.capacity`), so
        // only duplicates among capacities count.
        if !qualified_seen.insert(format!("capacity:{qualified}")) {
            issues.push(dropped(IssueReason::DuplicateName));
            continue;
        }
        if budget == 0 {
            issues.push(dropped(IssueReason::TooManyEntries));
            continue;
        }
        budget -= 1;
        capacity.insert(name.clone(), cap.clone());
    }

    Device {
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..device.clone()
    }
}

enum CheckedValue {
    Ok,
    /// Shortened string and its original length in bytes.
    Shortened(String, usize),
}

fn check_attribute_value(attr: &DeviceAttribute) -> Result<CheckedValue, IssueReason> {
    let set = usize::from(attr.bool.is_some())
        + usize::from(attr.int.is_some())
        + usize::from(attr.string.is_some())
        + usize::from(attr.version.is_some());
    match set {
        0 => return Err(IssueReason::NoValue),
        1 => {}
        _ => return Err(IssueReason::MultipleValues),
    }
    if let Some(s) = &attr.string
        && s.len() > MAX_ATTRIBUTE_VALUE_LEN
    {
        return Ok(CheckedValue::Shortened(
            truncate_at_char_boundary(s, MAX_ATTRIBUTE_VALUE_LEN).to_owned(),
            s.len(),
        ));
    }
    if let Some(v) = &attr.version {
        if v.len() > MAX_ATTRIBUTE_VALUE_LEN {
            return Err(IssueReason::VersionTooLong(v.len()));
        }
        if !is_semver(v) {
            return Err(IssueReason::InvalidVersion);
        }
    }
    Ok(CheckedValue::Ok)
}

/// The API server counts string length in bytes; cut on a char boundary so the
/// result stays valid UTF-8.
fn truncate_at_char_boundary(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Checks `[domain/]identifier` and returns the name qualified with the
/// driver's domain, used to detect `foo` vs `<driver>/foo` duplicates.
fn qualified_name(driver: &str, name: &str) -> Result<String, &'static str> {
    let (domain, id) = match name.split_once('/') {
        Some((domain, id)) => (Some(domain), id),
        None => (None, name),
    };
    if let Some(domain) = domain
        && (domain.is_empty() || domain.len() > MAX_NAME_DOMAIN_LEN || !is_dns_subdomain(domain))
    {
        return Err("domain must be a DNS subdomain of at most 63 characters");
    }
    if id.is_empty() || id.len() > MAX_IDENTIFIER_LEN || !is_c_identifier(id) {
        return Err("identifier must be a C identifier of at most 32 characters");
    }
    Ok(format!("{}/{id}", domain.unwrap_or(driver)))
}

fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// RFC 1123 label: lowercase alphanumerics and '-', starting and ending with
/// an alphanumeric, at most 63 characters.
pub(crate) fn is_dns_label(s: &str) -> bool {
    s.len() <= MAX_DEVICE_NAME_LEN && is_label_pattern(s)
}

fn is_label_pattern(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain as Kubernetes checks it: dot-separated labels of the
/// label pattern, at most 253 characters in all (Kubernetes does not limit
/// the length of each label here).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_pattern)
}

/// SemVer 2.0.0 (semver.org grammar): `MAJOR.MINOR.PATCH[-pre][+build]`,
/// no leading zeros in numeric parts or numeric pre-release identifiers, as
/// the API server parses version attributes. The `semver` crate is the one
/// SemVer grammar of the workspace: kube-cel's `semver()` parses with it too.
pub(crate) fn is_semver(s: &str) -> bool {
    semver::Version::parse(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::DeviceCapacity;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const DRIVER: &str = "efa.networking.k8s.aws";

    fn s(v: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(v.into()),
            ..Default::default()
        }
    }
    fn i(v: i64) -> DeviceAttribute {
        DeviceAttribute {
            int: Some(v),
            ..Default::default()
        }
    }
    fn ver(v: &str) -> DeviceAttribute {
        DeviceAttribute {
            version: Some(v.into()),
            ..Default::default()
        }
    }
    fn device(name: &str, attrs: Vec<(&str, DeviceAttribute)>) -> Device {
        Device {
            name: name.into(),
            attributes: Some(attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
            ..Default::default()
        }
    }

    /// One attribute per row: what survives and which issue is reported.
    #[test]
    fn attribute_table() {
        let long = "x".repeat(70);
        let long_utf8 = "é".repeat(40); // 80 bytes, 2 per char
        type Row = (
            &'static str,
            DeviceAttribute,
            Option<DeviceAttribute>,
            Option<(IssueAction, &'static str)>,
        );
        let cases: Vec<Row> = vec![
            ("rdmaDevice", s("rdmap79s0"), Some(s("rdmap79s0")), None),
            (
                "resource.kubernetes.io/pcieRoot",
                s("pci0000:10"),
                Some(s("pci0000:10")),
                None,
            ),
            ("numa_node", i(-1), Some(i(-1)), None),
            (
                "draDriverVersion",
                ver("1.2.3-rc.1+g1234"),
                Some(ver("1.2.3-rc.1+g1234")),
                None,
            ),
            ("x", s(&"y".repeat(64)), Some(s(&"y".repeat(64))), None),
            (
                "long",
                s(&long),
                Some(s(&"x".repeat(64))),
                Some((IssueAction::AttributeShortened, "value_too_long")),
            ),
            (
                "utf8",
                s(&long_utf8),
                Some(s(&"é".repeat(32))),
                Some((IssueAction::AttributeShortened, "value_too_long")),
            ),
            (
                "9lives",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "has-dash",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "a_very_long_identifier_of_33_char",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "Bad_Domain.com/x",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "/x",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "a/b/c",
                s("a"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_name")),
            ),
            (
                "nothing",
                DeviceAttribute::default(),
                None,
                Some((IssueAction::AttributeDropped, "no_value")),
            ),
            (
                "two",
                DeviceAttribute {
                    int: Some(1),
                    bool: Some(true),
                    ..Default::default()
                },
                None,
                Some((IssueAction::AttributeDropped, "multiple_values")),
            ),
            (
                "v",
                ver("1.2"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_version")),
            ),
            (
                "v",
                ver("01.2.3"),
                None,
                Some((IssueAction::AttributeDropped, "invalid_version")),
            ),
            (
                "v",
                ver(&format!("1.2.3-{}", "a".repeat(60))),
                None,
                Some((IssueAction::AttributeDropped, "version_too_long")),
            ),
        ];
        for (name, attr, want, want_issue) in cases {
            let d = device("dev-0", vec![(name, attr), ("keep", i(1))]);
            let (out, issues) = validate_devices(DRIVER, &[d]);
            assert_eq!(out.len(), 1, "{name}: device must survive");
            let attrs = out[0].attributes.clone().unwrap_or_default();
            assert_eq!(attrs.get(name), want.as_ref(), "{name}");
            assert_eq!(
                attrs.get("keep"),
                Some(&i(1)),
                "{name}: other attribute kept"
            );
            let got: Vec<_> = issues
                .iter()
                .map(|i| (i.action, i.reason.as_str()))
                .collect();
            assert_eq!(got, want_issue.into_iter().collect::<Vec<_>>(), "{name}");
            for issue in &issues {
                assert_eq!(issue.entry.as_deref(), Some(name));
            }
        }
    }

    #[test]
    fn device_names() {
        let long = "a".repeat(64);
        let devices: Vec<Device> = [
            "efa-0000-4f-00-0",
            "Bad",
            "-x",
            "x-",
            "",
            &long,
            "a.b",
            "efa-0000-4f-00-0",
            "ok",
        ]
        .iter()
        .map(|n| device(n, vec![]))
        .collect();
        let (out, issues) = validate_devices(DRIVER, &devices);
        let names: Vec<_> = out.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["efa-0000-4f-00-0", "ok"]);
        let reasons: Vec<_> = issues
            .iter()
            .map(|i| (i.device.as_str(), i.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                ("Bad", "invalid_device_name"),
                ("-x", "invalid_device_name"),
                ("x-", "invalid_device_name"),
                ("", "invalid_device_name"),
                (long.as_str(), "invalid_device_name"),
                ("a.b", "invalid_device_name"),
                ("efa-0000-4f-00-0", "duplicate_device_name"),
            ]
        );
        assert!(
            issues
                .iter()
                .all(|i| i.action == IssueAction::DeviceDropped)
        );
        // Empty maps are not published (the server drops them anyway).
        assert_eq!(out[0].attributes, None);
    }

    #[test]
    fn unqualified_and_driver_qualified_names_collide() {
        let d = device(
            "d",
            vec![
                ("foo", i(1)),
                ("efa.networking.k8s.aws/foo", i(2)),
                ("other.io/foo", i(3)),
            ],
        );
        let (out, issues) = validate_devices(DRIVER, &[d]);
        let attrs = out[0].attributes.clone().unwrap_or_default();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs.get("other.io/foo"), Some(&i(3)));
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].reason, IssueReason::DuplicateName);
    }

    #[test]
    fn at_most_32_attributes_and_capacities() {
        let names: Vec<String> = (0..30).map(|n| format!("a{n:02}")).collect();
        let mut d = device("d", names.iter().map(|n| (n.as_str(), i(1))).collect());
        d.capacity = Some(
            ["c1", "c2", "c3", "bad-name"]
                .iter()
                .map(|n| {
                    (
                        n.to_string(),
                        DeviceCapacity {
                            value: Quantity("1Gi".into()),
                            ..Default::default()
                        },
                    )
                })
                .chain([(
                    "c0".to_string(),
                    DeviceCapacity {
                        value: Quantity("lots".into()),
                        ..Default::default()
                    },
                )])
                .collect(),
        );
        let (out, issues) = validate_devices(DRIVER, &[d]);
        assert_eq!(out[0].attributes.as_ref().map(BTreeMap::len), Some(30));
        let caps: Vec<_> = out[0]
            .capacity
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(caps, ["c1", "c2"]);
        let got: Vec<_> = issues
            .iter()
            .map(|i| {
                (
                    i.entry.as_deref().unwrap_or(""),
                    i.action,
                    i.reason.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("bad-name", IssueAction::CapacityDropped, "invalid_name"),
                ("c0", IssueAction::CapacityDropped, "invalid_quantity"),
                ("c3", IssueAction::CapacityDropped, "too_many_entries"),
            ]
        );
    }

    #[test]
    fn semver_table() {
        for ok in [
            "0.0.0",
            "1.2.3",
            "10.20.30",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-0.3.7",
            "1.0.0-x.7.z.92",
            "1.0.0+20130313144700",
            "1.0.0-beta+exp.sha.5114f85",
            "1.0.0-x-y-z.--",
        ] {
            assert!(is_semver(ok), "{ok}");
        }
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.1.1",
            "1.01.1",
            "1.1.01",
            "1.2.3-",
            "1.2.3-01",
            "1.2.3+",
            "1.2.3-a..b",
            "v1.2.3",
            "1.2.3-a_b",
            "1.2.3+a+b",
            " 1.2.3",
        ] {
            assert!(!is_semver(bad), "{bad}");
        }
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("resource.kubernetes.io"));
        assert!(is_dns_subdomain("ip-10-0-0-1.ec2.internal"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("A.b"));
        assert!(!is_dns_subdomain(&"a".repeat(254)));
    }

    proptest::proptest! {
        #[test]
        fn validated_devices_always_within_limits(
            attrs in proptest::collection::btree_map("[a-zA-Z0-9_./-]{0,40}", "\\PC{0,80}", 0..40)
        ) {
            let d = Device {
                name: "d".into(),
                attributes: Some(attrs.into_iter().map(|(k, v)| (k, s(&v))).collect()),
                ..Default::default()
            };
            let (out, _) = validate_devices(DRIVER, &[d]);
            let attrs = out[0].attributes.clone().unwrap_or_default();
            proptest::prop_assert!(attrs.len() <= MAX_ATTRIBUTES_AND_CAPACITIES);
            for (k, v) in attrs {
                proptest::prop_assert!(qualified_name(DRIVER, &k).is_ok());
                proptest::prop_assert!(v.string.is_some_and(|s| s.len() <= MAX_ATTRIBUTE_VALUE_LEN));
            }
        }
    }
}
