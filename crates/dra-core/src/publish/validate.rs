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
mod tests;
