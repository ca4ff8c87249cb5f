//! The types the checker infers: only those an expression fixes by itself;
//! everything read from a device's attributes is dynamic.

use crate::cel::types::TYPE_NAMES;

/// A type fixed by the expression itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    Quantity,
    Semver,
    Ip,
    Cidr,
    Url,
    Duration,
    Timestamp,
    /// An attribute value: the DRA environment declares attributes as
    /// `map(string, map(string, google.protobuf.Any))`, which the checker
    /// treats as dynamic for overloads but as its own type in list literals
    /// and format clauses.
    Any,
    /// `device.attributes`: `map(string, map(string, any))`.
    Attributes,
    /// `device.attributes[domain]`: `map(string, any)`.
    AttributeDomain,
    /// `device.capacity`: `map(string, map(string, kubernetes.Quantity))`.
    Capacity,
    /// `device.capacity[domain]`.
    CapacityDomain,
    /// A list whose elements are strings (`split`, `findAll`, a literal of
    /// strings): what the cost estimate of the list functions depends on.
    StringList,
    /// A type value (`int`, `type(x)`), by its CEL type's name:
    /// `type(int)`, `type(any)` for the type of an attribute, `type(dyn)`
    /// when the checker does not know it.
    Type(&'static str),
}

impl Ty {
    pub(super) fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bytes => "bytes",
            Ty::Null => "null",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Quantity => "kubernetes.Quantity",
            Ty::Semver => "kubernetes.Semver",
            Ty::Ip => "net.IP",
            Ty::Cidr => "net.CIDR",
            Ty::Url => "kubernetes.URL",
            Ty::Duration => "google.protobuf.Duration",
            Ty::Timestamp => "google.protobuf.Timestamp",
            Ty::Any => "any",
            Ty::Attributes | Ty::Capacity => "map(string, map(string, dyn))",
            Ty::AttributeDomain | Ty::CapacityDomain => "map(string, dyn)",
            Ty::StringList => "list(string)",
            Ty::Type(name) => name,
        }
    }

    pub(super) fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    pub(super) fn is_map(self) -> bool {
        matches!(
            self,
            Ty::Map | Ty::Attributes | Ty::AttributeDomain | Ty::Capacity | Ty::CapacityDomain
        )
    }

    pub(super) fn is_list(self) -> bool {
        matches!(self, Ty::List | Ty::StringList)
    }

    /// Whether two types known to the checker are the same CEL type, `None`
    /// where we track too little to tell (a list of unknown elements, a map
    /// of unknown entries).
    pub(super) fn same(self, other: Ty) -> Option<bool> {
        if self == other {
            return Some(true);
        }
        let vague = |name| matches!(name, "type(dyn)" | "type(list)" | "type(map)");
        if let (Ty::Type(a), Ty::Type(b)) = (self, other)
            && (vague(a) || vague(b))
        {
            return None;
        }
        if (self.is_list() && other.is_list()) || (self.is_map() && other.is_map()) {
            return None;
        }
        Some(false)
    }

    /// The type of the element a `[...]` or `.field` on this type reads.
    pub(super) fn element(self) -> Option<Ty> {
        match self {
            Ty::Attributes => Some(Ty::AttributeDomain),
            Ty::Capacity => Some(Ty::CapacityDomain),
            Ty::AttributeDomain => Some(Ty::Any),
            Ty::CapacityDomain => Some(Ty::Quantity),
            Ty::StringList => Some(Ty::String),
            _ => None,
        }
    }
}

/// The type value a type name denotes, when `name` is one.
pub(super) fn type_name(name: &str) -> Option<Ty> {
    TYPE_NAMES
        .contains(&name)
        .then(|| Ty::Type(type_of_name(name)))
}

/// The type of `type(x)` for an `x` of type `t` (`None`: not known).
pub(super) fn type_of(t: Option<Ty>) -> Ty {
    Ty::Type(match t {
        None => "type(dyn)",
        Some(Ty::Bool) => "type(bool)",
        Some(Ty::Int) => "type(int)",
        Some(Ty::Uint) => "type(uint)",
        Some(Ty::Double) => "type(double)",
        Some(Ty::String) => "type(string)",
        Some(Ty::Bytes) => "type(bytes)",
        Some(Ty::Null) => "type(null_type)",
        Some(Ty::List | Ty::StringList) => "type(list)",
        Some(
            Ty::Map | Ty::Attributes | Ty::AttributeDomain | Ty::Capacity | Ty::CapacityDomain,
        ) => "type(map)",
        Some(Ty::Quantity) => "type(kubernetes.Quantity)",
        Some(Ty::Semver) => "type(kubernetes.Semver)",
        Some(Ty::Ip) => "type(net.IP)",
        Some(Ty::Cidr) => "type(net.CIDR)",
        Some(Ty::Url) => "type(kubernetes.URL)",
        Some(Ty::Duration) => "type(google.protobuf.Duration)",
        Some(Ty::Timestamp) => "type(google.protobuf.Timestamp)",
        Some(Ty::Any) => "type(any)",
        Some(Ty::Type(_)) => "type(type)",
    })
}

fn type_of_name(name: &str) -> &'static str {
    match name {
        "bool" => "type(bool)",
        "bytes" => "type(bytes)",
        "double" => "type(double)",
        "google.protobuf.Duration" => "type(google.protobuf.Duration)",
        "google.protobuf.Timestamp" => "type(google.protobuf.Timestamp)",
        "int" => "type(int)",
        "list" => "type(list)",
        "map" => "type(map)",
        "null_type" => "type(null_type)",
        "optional_type" => "type(optional_type)",
        "string" => "type(string)",
        "type" => "type(type)",
        "uint" => "type(uint)",
        "net.IP" => "type(net.IP)",
        "net.CIDR" => "type(net.CIDR)",
        _ => "type(dyn)",
    }
}
