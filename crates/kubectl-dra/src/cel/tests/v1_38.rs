//! What Kubernetes 1.38 changes for selectors, and what it keeps, checked
//! on 1.37 and 1.38. The expected outcomes are what the 1.37.2 and
//! 1.38.0-beta.0 DRA compilers (`k8s.io/dynamic-resource-allocation/cel`,
//! new expressions as the API server validates them, stored ones as the
//! scheduler evaluates them) gave for the same expressions on the same
//! device.

use super::super::*;
use super::{efa_device, neuron_device};

use Outcome::{Match, NoMatch};

const EFA: &str = "efa.networking.k8s.aws";

fn runtime() -> Outcome {
    Outcome::RuntimeError(String::new())
}

fn invalid() -> Outcome {
    Outcome::Invalid(String::new())
}

fn unsupported() -> Outcome {
    Outcome::Unsupported(String::new())
}

/// `["E"]` stands for the EFA driver's domain, as in cel-selectors.txt.
fn expand(expression: &str) -> String {
    expression.replace(r#"["E"]"#, &format!(r#"["{EFA}"]"#))
}

fn same(got: &Outcome, want: &Outcome) -> bool {
    std::mem::discriminant(got) == std::mem::discriminant(want)
}

/// Checks each (expression, outcome on 1.37, outcome on 1.38) on `device`.
fn check(device: &DeviceValue, cases: &[(&str, Outcome, Outcome)]) {
    let envs = [
        Environment::for_release(Release::V1_37),
        Environment::for_release(Release::V1_38),
    ];
    let mut failures = Vec::new();
    for (expression, on_37, on_38) in cases {
        let expression = expand(expression);
        let selector = Selector::compile(&expression);
        for (env, want) in envs.iter().zip([on_37, on_38]) {
            let got = selector.evaluate(env, device);
            if !same(&got, want) {
                failures.push(format!(
                    "{} {expression}: got {got:?}, want {want:?}",
                    env.release()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// cel-go v0.33 sizes a type value, so the 1.38 API server accepts `==` and
/// `!=` on type values, which the 1.37 one refuses as too complex; the type
/// names evaluate as in cel-go.
#[test]
fn type_values_compare_from_1_38() {
    let efa = DeviceValue::new(EFA, &efa_device());
    check(
        &efa,
        &[
            // the two selectors of the differential test that 1.38 accepts
            (
                r#"type(device.attributes["E"].efaGeneration) == int"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.attributes["E"].instanceType) == string"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.attributes["E"].efaGeneration) == string"#,
                invalid(),
                NoMatch,
            ),
            (
                r#"type(device.attributes["E"].instanceType) == int"#,
                invalid(),
                NoMatch,
            ),
            (
                r#"type(device.attributes["E"].efaGeneration) != int"#,
                invalid(),
                NoMatch,
            ),
            (
                r#"type(device.attributes["E"].firmwareVersion) == bool"#,
                invalid(),
                NoMatch,
            ),
            (
                r#"type(device.attributes["E"].draDriverVersion) == type(semver("1.0.0"))"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.attributes["E"]) == map && type(device.attributes) == map"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.attributes["gpu.nvidia.com"]) == map"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.allowMultipleAllocations) == bool"#,
                invalid(),
                Match,
            ),
            (
                r#"type(device.attributes["E"].missing) == int"#,
                invalid(),
                runtime(),
            ),
            (
                r#"type(device.attributes["E"].?efaGeneration) == optional_type"#,
                invalid(),
                Match,
            ),
            (
                "type(true) == bool && type(1u) == uint && type(1.0) == double",
                invalid(),
                Match,
            ),
            (
                r#"type(b"a") == bytes && type(null) == null_type && type(int) == type"#,
                invalid(),
                Match,
            ),
            (
                r#"type([1]) == list && type({"a": 1}) == map && list != map"#,
                invalid(),
                Match,
            ),
            (
                r#"type(duration("1s")) == google.protobuf.Duration"#,
                invalid(),
                Match,
            ),
            (
                r#"type(timestamp("2024-01-01T00:00:00Z")) == google.protobuf.Timestamp"#,
                invalid(),
                Match,
            ),
            (
                r#"type(ip("10.0.0.1")) == net.IP && type(cidr("10.0.0.0/8")) != net.IP"#,
                invalid(),
                Match,
            ),
            (
                "type(1) == type(2) && type(type(1)) == type",
                invalid(),
                Match,
            ),
            // an attribute has a known size: fine before 1.38 as well
            (
                r#"type(1) == device.attributes["E"].efaGeneration"#,
                NoMatch,
                NoMatch,
            ),
            // membership and literals of one type of type are fine in both
            ("type(1) in [int]", Match, Match),
            ("[int, int].size() == 2", Match, Match),
            // a type name is shadowed by a variable of that name
            ("[1].all(int, int == 1)", Match, Match),
            // what neither API server accepts
            ("[int, string].size() == 2", invalid(), invalid()),
            (
                r#"type(device.attributes["E"].efaGeneration) in [int, string]"#,
                invalid(),
                invalid(),
            ),
            (
                r#"[type(device.attributes["E"].efaGeneration), int].size() == 2"#,
                invalid(),
                invalid(),
            ),
            ("type(1) == 1", invalid(), invalid()),
            ("int < string", invalid(), invalid()),
            ("int + 1 == 2", invalid(), invalid()),
            (r#"string(int) == "int""#, invalid(), invalid()),
            ("type(1).size() == 1", invalid(), invalid()),
            ("[int].exists(t, t == type(1))", invalid(), invalid()),
            ("cel.bind(t, type(1), t == int)", invalid(), invalid()),
            (
                r#"type(device.attributes["E"].efaGeneration) == int ? 1 : 2 == 1"#,
                invalid(),
                invalid(),
            ),
            (
                r#"type(quantity("1")) == kubernetes.Quantity"#,
                invalid(),
                invalid(),
            ),
            (
                "google.protobuf.Any == google.protobuf.Any",
                invalid(),
                invalid(),
            ),
            ("dyn == dyn", invalid(), invalid()),
        ],
    );
    let neuron = DeviceValue::new("neuron.aws.com", &neuron_device());
    check(
        &neuron,
        &[(
            r#"type(device.capacity["neuron.aws.com"].memory) == type(quantity("1"))"#,
            invalid(),
            Match,
        )],
    );
}

/// `isMask` comes with CIDR library v1 in the 1.38 environment: the 1.38
/// API server (checking against 1.37) refuses it as new, the 1.38 scheduler
/// evaluates it. The rest of the library reads as in v0.
#[test]
fn cidr_v1_adds_is_mask() {
    let efa = DeviceValue::new(EFA, &efa_device());
    check(
        &efa,
        &[
            (r#"cidr("10.0.0.0/8").isMask()"#, invalid(), invalid()),
            (r#"cidr("10.1.2.3/8").ip() == ip("10.1.2.3")"#, Match, Match),
            (
                r#"isCIDR("10.1.2.3/8") && cidr("10.1.2.3/8").masked() == cidr("10.0.0.0/8")"#,
                Match,
                Match,
            ),
            (
                r#"cidr("10.1.2.3/8").containsIP("10.200.0.1")"#,
                Match,
                Match,
            ),
        ],
    );
    let env = Environment::for_release(Release::V1_38);
    for (expression, want) in [
        (r#"cidr("10.0.0.0/8").isMask()"#, Match),
        (r#"cidr("10.0.0.1/8").isMask()"#, NoMatch),
        (r#"cidr("10.0.0.1/8").masked().isMask()"#, Match),
        (r#"cidr("::/0").isMask()"#, Match),
        (r#"cidr("2001:db8::1/64").isMask()"#, NoMatch),
    ] {
        let got = Selector::compile(expression).evaluate_stored(&env, &efa);
        assert!(
            same(&got, &want),
            "{expression}: got {got:?}, want {want:?}"
        );
    }
    let why = Selector::compile(r#"cidr("10.0.0.0/8").isMask()"#).invalid(Release::V1_38);
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("against the 1.37 environment")),
        "{why:?}"
    );
}

/// 1.38 pins the optional types at version 2, which every release had:
/// `optional.unwrap` and `unwrapOpt` are there, v3's `hasValue(v)` is not.
#[test]
fn optional_types_stay_at_version_2() {
    let efa = DeviceValue::new(EFA, &efa_device());
    check(
        &efa,
        &[
            (
                "optional.unwrap([optional.of(1), optional.none()]) == [1]",
                Match,
                Match,
            ),
            (
                "[optional.none(), optional.of(2)].unwrapOpt() == [2]",
                Match,
                Match,
            ),
            (
                r#"[device.attributes["E"].?efaGeneration, device.attributes["E"].?missing].unwrapOpt() == [2]"#,
                Match,
                Match,
            ),
            (
                "[1, 2].first().value() == 1 && [1, 2].last().value() == 2",
                Match,
                Match,
            ),
            (
                "optional.none().or(optional.of(1)).value() == 1",
                Match,
                Match,
            ),
            ("optional.of(1).hasValue(1)", invalid(), invalid()),
            ("optional.of(1).value(1) == 1", invalid(), invalid()),
        ],
    );
}

/// Timestamps read as Go's `time.Parse(time.RFC3339, …)` in both releases
/// (1.38 turns cel-go v0.33's strict parsing off), accessors in UTC or the
/// zone given, offsets not range checked.
#[test]
fn timestamps_parse_as_before_strict_parsing() {
    let efa = DeviceValue::new(EFA, &efa_device());
    let both = |e: &'static str, o: Outcome| (e, o.clone(), o);
    check(
        &efa,
        &[
            both(r#"timestamp("2024-01-01T0:00:00Z").getHours() == 0"#, Match),
            both(
                r#"timestamp("2024-01-01T00:00:00,5Z").getMilliseconds() == 500"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+24:00").getDate() == 31"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+00:60").getHours() == 23"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+01:00").getFullYear() == 2023"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+01:00").getHours() == 23"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("+25:00") == 1"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("-02:30") == 21"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getMinutes("-02:30") == 30"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("05:00") == 5"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("UTC") == 0"#,
                Match,
            ),
            both(
                r#"timestamp("2024-03-10T12:00:00Z").getDayOfWeek() == 0"#,
                Match,
            ),
            both(
                r#"timestamp("2024-03-10T12:00:00Z").getDayOfYear() == 69"#,
                Match,
            ),
            both(
                r#"timestamp("2024-03-10T12:00:00Z").getMonth() == 2"#,
                Match,
            ),
            both(
                r#"timestamp("2024-03-10T12:00:00Z").getDayOfMonth() == 9"#,
                Match,
            ),
            both(
                r#"timestamp("2024-03-10T12:00:00Z").getDate() == 10"#,
                Match,
            ),
            both(
                r#"timestamp(1) == timestamp("1970-01-01T00:00:01Z")"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z") + duration("1h") > timestamp("2024-01-01T00:00:00Z")"#,
                Match,
            ),
            both(
                r#"timestamp("2024-01-02T00:00:00Z") - timestamp("2024-01-01T00:00:00Z") == duration("24h")"#,
                Match,
            ),
            both(r#"duration("1h30m").getMinutes() == 90"#, Match),
            // literals the API server cannot parse
            both(
                r#"timestamp("2023-02-29T00:00:00Z").getDate() == 29"#,
                invalid(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+25:00").getHours() == 23"#,
                invalid(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00z").getHours() == 0"#,
                invalid(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00+0100").getHours() == 23"#,
                invalid(),
            ),
            both(
                r#"timestamp("0001-01-01T00:00:00+01:00").getFullYear() == 0"#,
                invalid(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00").getHours() == 0"#,
                invalid(),
            ),
            // run-time failures and what we cannot do
            both(
                r#"timestamp(device.attributes["E"].instanceType).getHours() == 0"#,
                runtime(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("1:x") == 0"#,
                runtime(),
            ),
            both(
                r#"timestamp("2024-01-01T00:00:00Z").getHours("Europe/Berlin") == 1"#,
                unsupported(),
            ),
        ],
    );
}

/// From 1.38 ordering a NaN is false; before, the scheduler fails on it.
/// Everything else orders as before.
#[test]
fn nan_orders_as_false_from_1_38() {
    let efa = DeviceValue::new(EFA, &efa_device());
    check(
        &efa,
        &[
            ("0.0/0.0 < 1.0", runtime(), NoMatch),
            ("!(0.0/0.0 >= 1)", runtime(), Match),
            ("0.0/0.0 > 1u || 0.0/0.0 <= 0.0/0.0", runtime(), NoMatch),
            (
                r#"device.attributes["E"].efaGeneration < 0.0/0.0"#,
                runtime(),
                NoMatch,
            ),
            ("0.0/0.0 != 0.0/0.0", Match, Match),
            ("1 < 2u && 2.5 > 2 && -1 < 1u", Match, Match),
            (r#""a" < "b" && b"a" < b"b" && true > false"#, Match, Match),
            (
                r#"duration("1s") < duration("1m") && timestamp("2024-01-01T00:00:00Z") <= timestamp("2024-01-01T00:00:00Z")"#,
                Match,
                Match,
            ),
            (r#"device.attributes["E"].efaGeneration >= 2"#, Match, Match),
            (
                r#"device.attributes["E"].instanceType > 3"#,
                runtime(),
                runtime(),
            ),
            (r#""a" < 1"#, invalid(), invalid()),
        ],
    );
}

/// A newer release is judged with the newest environment: a 1.39 API
/// server's selectors as 1.38's.
#[test]
fn a_newer_release_uses_the_newest_environment() {
    let efa = DeviceValue::new(EFA, &efa_device());
    let release: Release = "v1.39.0".parse().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(release, Release::V1_38);
    let env = Environment::for_release(release);
    let selector = Selector::compile(&expand(
        r#"type(device.attributes["E"].efaGeneration) == int"#,
    ));
    assert_eq!(selector.evaluate(&env, &efa), Match);
    assert!(
        Selector::compile("[1].includes(1)")
            .invalid(release)
            .is_none()
    );
}
