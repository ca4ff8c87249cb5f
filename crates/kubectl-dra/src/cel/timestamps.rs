//! `timestamp(…)` and the timestamp accessors as Kubernetes has them.
//!
//! Kubernetes 1.38 builds with cel-go v0.33, which parses timestamps
//! strictly by default; its base environment turns that off
//! (`cel.StrictTimestampParsing(false)`), so every release we model reads a
//! timestamp as Go's `time.Parse(time.RFC3339, s)` does, then refuses what
//! falls outside years 1 to 9999 (cel-go's `timestamp_legacy.go`):
//!
//! - the hour may have one digit (`T1:02:03Z`); every other field has its
//!   fixed number of digits;
//! - the fraction of a second may follow a `.` or a `,`, with any number
//!   of digits (those past nine are dropped);
//! - the zone is `Z` or `±hh:mm`, with hours up to 24 and minutes up to 60;
//! - the day must exist in its month, and nothing may follow.
//!
//! The accessors (`getHours()`, …) read the time in UTC, or in the zone
//! given: a numeric offset `[±]h:m` is taken as is, without range check
//! (`"+25:00"` is 25 hours east). The API server validates a literal
//! `timestamp("…")` by parsing it (`literals`), with the same rules.
//!
//! The `cel` crate parses RFC 3339 strictly and keeps each timestamp's own
//! offset for the accessors, so these replace its `timestamp` and its
//! accessors. A zone name (`"Europe/Berlin"`) needs a time zone database
//! we do not carry: such a call is reported as one we cannot evaluate.

use std::sync::Arc;

use kube_cel::cel::extractors::This;
use kube_cel::cel::functions::time as crate_time;
use kube_cel::cel::{Context, ExecutionError, FunctionContext, Value};

/// How an error message starts when we, not the expression, are the reason
/// it cannot be evaluated (see `classify`).
pub(super) const CANNOT: &str = "kubectl-dra cannot evaluate ";

/// Seconds since the epoch of 0001-01-01T00:00:00Z and of
/// 9999-12-31T23:59:59Z, the range of a CEL timestamp.
const MIN_UNIX: i64 = -62_135_596_800;
const MAX_UNIX: i64 = 253_402_300_799;

/// A point in time: seconds since the epoch and nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Instant {
    pub secs: i64,
    pub nanos: u32,
}

/// `s` as cel-go reads a timestamp string with strict parsing off.
pub(super) fn parse(s: &str) -> Result<Instant, &'static str> {
    let b = s.as_bytes();
    let mut at = 0;
    let year = fixed_digits(b, &mut at, 4).ok_or("bad year")?;
    literal(b, &mut at, b'-')?;
    let month = fixed_digits(b, &mut at, 2).ok_or("bad month")?;
    literal(b, &mut at, b'-')?;
    let day = fixed_digits(b, &mut at, 2).ok_or("bad day")?;
    literal(b, &mut at, b'T')?;
    // `15` in Go's layout: one or two digits.
    let hour = match fixed_digits(b, &mut at, 2) {
        Some(h) => h,
        None => fixed_digits(b, &mut at, 1).ok_or("bad hour")?,
    };
    literal(b, &mut at, b':')?;
    let minute = fixed_digits(b, &mut at, 2).ok_or("bad minute")?;
    literal(b, &mut at, b':')?;
    let second = fixed_digits(b, &mut at, 2).ok_or("bad second")?;
    let mut nanos = 0u32;
    if matches!(b.get(at), Some(b'.' | b',')) && b.get(at + 1).is_some_and(u8::is_ascii_digit) {
        at += 1;
        let mut scale = 100_000_000u32;
        while let Some(d) = b.get(at).filter(|d| d.is_ascii_digit()) {
            nanos += u32::from(d - b'0') * scale;
            scale /= 10;
            at += 1;
        }
    }
    let offset = match b.get(at) {
        Some(b'Z') => {
            at += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            let sign = if *sign == b'-' { -1 } else { 1 };
            at += 1;
            let h = fixed_digits(b, &mut at, 2).ok_or("bad zone")?;
            literal(b, &mut at, b':')?;
            let m = fixed_digits(b, &mut at, 2).ok_or("bad zone")?;
            if h > 24 || m > 60 {
                return Err("zone offset out of range");
            }
            sign * (h * 60 + m) * 60
        }
        _ => return Err("bad zone"),
    };
    if at != b.len() {
        return Err("extra text");
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err("out of range");
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
    if !(MIN_UNIX..=MAX_UNIX).contains(&secs) {
        return Err("timestamp overflow");
    }
    Ok(Instant { secs, nanos })
}

fn fixed_digits(b: &[u8], at: &mut usize, n: usize) -> Option<i64> {
    let digits = b.get(*at..*at + n)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    *at += n;
    Some(digits.iter().fold(0, |v, d| v * 10 + i64::from(d - b'0')))
}

fn literal(b: &[u8], at: &mut usize, c: u8) -> Result<(), &'static str> {
    if b.get(*at) == Some(&c) {
        *at += 1;
        Ok(())
    } else {
        Err("unexpected character")
    }
}

fn leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in(year: i64, month: i64) -> i64 {
    match month {
        2 if leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month 1-12, day 1-31) of a day since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The crate's timestamp of an instant (in UTC), through its strict parser.
fn value_of(t: Instant) -> Result<Value, ExecutionError> {
    let (y, mo, d) = civil_from_days(t.secs.div_euclid(86_400));
    let s = t.secs.rem_euclid(86_400);
    let text = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        t.nanos
    );
    crate_time::timestamp(Arc::new(text))
}

pub(super) fn register(ctx: &mut Context<'static>) {
    ctx.add_function("timestamp", timestamp);
    for field in FIELDS {
        ctx.add_function(field.name(), move |ftx: &FunctionContext| {
            accessor(ftx, field)
        });
    }
}

/// `timestamp(string)`, `timestamp(int)` (seconds since the epoch) and
/// `timestamp(timestamp)`.
fn timestamp(ftx: &FunctionContext) -> Result<Value, ExecutionError> {
    let [arg] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    match ftx.ptx.resolve(arg)? {
        Value::String(s) => match parse(&s) {
            Ok(t) => value_of(t),
            Err(why) => Err(ftx.error(format!(
                "type conversion error from 'string' to 'google.protobuf.Timestamp': {s:?}: {why}"
            ))),
        },
        Value::Int(secs) if (MIN_UNIX..=MAX_UNIX).contains(&secs) => {
            value_of(Instant { secs, nanos: 0 })
        }
        Value::Int(_) => Err(ftx.error("timestamp overflow")),
        t @ Value::Timestamp(_) => Ok(t),
        other => Err(ftx.error(format!("no such overload: timestamp({})", other.type_of()))),
    }
}

#[derive(Clone, Copy)]
enum Field {
    FullYear,
    Month,
    DayOfYear,
    DayOfMonth,
    Date,
    DayOfWeek,
    Hours,
    Minutes,
    Seconds,
    Milliseconds,
}

const FIELDS: [Field; 10] = [
    Field::FullYear,
    Field::Month,
    Field::DayOfYear,
    Field::DayOfMonth,
    Field::Date,
    Field::DayOfWeek,
    Field::Hours,
    Field::Minutes,
    Field::Seconds,
    Field::Milliseconds,
];

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::FullYear => "getFullYear",
            Field::Month => "getMonth",
            Field::DayOfYear => "getDayOfYear",
            Field::DayOfMonth => "getDayOfMonth",
            Field::Date => "getDate",
            Field::DayOfWeek => "getDayOfWeek",
            Field::Hours => "getHours",
            Field::Minutes => "getMinutes",
            Field::Seconds => "getSeconds",
            Field::Milliseconds => "getMilliseconds",
        }
    }

    /// The field of a local time (seconds since the epoch, shifted into
    /// the zone) as cel-go gives it: months and days of the year and of the
    /// month count from 0, the day of the week from Sunday.
    fn of(self, local: i64, nanos: u32) -> i64 {
        let days = local.div_euclid(86_400);
        let in_day = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        match self {
            Field::FullYear => year,
            Field::Month => month - 1,
            Field::DayOfYear => days - days_from_civil(year, 1, 1),
            Field::DayOfMonth => day - 1,
            Field::Date => day,
            Field::DayOfWeek => (days + 4).rem_euclid(7),
            Field::Hours => in_day / 3600,
            Field::Minutes => in_day / 60 % 60,
            Field::Seconds => in_day % 60,
            Field::Milliseconds => i64::from(nanos / 1_000_000),
        }
    }
}

fn accessor(ftx: &FunctionContext, field: Field) -> Result<Value, ExecutionError> {
    let this = ftx
        .this
        .clone()
        .ok_or_else(|| ftx.error("must be called as a method"))?;
    let zone = match ftx.args {
        [] => None,
        [zone] => match ftx.ptx.resolve(zone)? {
            Value::String(z) => Some(z),
            other => return Err(ftx.error(format!("no such overload: zone {}", other.type_of()))),
        },
        _ => return Err(ftx.error("expects at most a time zone")),
    };
    match (&this, zone) {
        (Value::Timestamp(t), zone) => {
            let offset = match zone {
                Some(z) => zone_offset(ftx, &z)?,
                None => 0,
            };
            let local = t.timestamp().saturating_add(offset);
            Ok(Value::Int(field.of(local, t.timestamp_subsec_nanos())))
        }
        (Value::Duration(_), None) => match field {
            Field::Hours => crate_time::get_hours(This(this)),
            Field::Minutes => crate_time::get_minutes(This(this)),
            Field::Seconds => crate_time::get_seconds(This(this)),
            Field::Milliseconds => crate_time::get_milliseconds(This(this)),
            _ => Err(ftx.error("no such overload for a duration")),
        },
        (other, _) => Err(ftx.error(format!("no such overload for {}", other.type_of()))),
    }
}

/// Seconds east of UTC of a zone argument, as cel-go before strict parsing
/// read it: `h:m` with Go's `strconv.Atoi` on each side, the minutes taken
/// away when the text starts with `-`, nothing range checked.
fn zone_offset(ftx: &FunctionContext, zone: &str) -> Result<i64, ExecutionError> {
    let Some((h, m)) = zone.split_once(':') else {
        return match zone {
            "" | "UTC" => Ok(0),
            name => Err(ftx.error(format!(
                "{CANNOT}the time zone {name:?}: kubectl-dra has no time zone database"
            ))),
        };
    };
    let atoi = |s: &str| {
        let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|d| d.is_ascii_digit()) {
            return None;
        }
        s.parse::<i64>().ok()
    };
    let (Some(h), Some(m)) = (atoi(h), atoi(m)) else {
        return Err(ftx.error(format!("invalid time zone offset {zone:?}")));
    };
    let minutes = if zone.starts_with('-') {
        h.wrapping_mul(60).wrapping_sub(m)
    } else {
        h.wrapping_mul(60).wrapping_add(m)
    };
    // Go: int((time.Duration(minutes) * time.Minute).Seconds()), which
    // wraps around on overflow.
    Ok(minutes.wrapping_mul(60_000_000_000) / 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_timestamps_as_go_time_parse_rfc3339() {
        let at = |s: &str| parse(s).map(|t| (t.secs, t.nanos));
        // 2024-01-01T00:00:00Z
        let new_year = 1_704_067_200;
        for (text, want) in [
            ("2024-01-01T00:00:00Z", Some((new_year, 0))),
            ("2024-01-01T01:00:00+01:00", Some((new_year, 0))),
            ("2023-12-31T23:00:00-01:00", Some((new_year, 0))),
            ("2024-01-01T0:00:00Z", Some((new_year, 0))),
            ("2024-01-01T00:00:00,5Z", Some((new_year, 500_000_000))),
            (
                "2024-01-01T00:00:00.123456789123Z",
                Some((new_year, 123_456_789)),
            ),
            ("2024-01-01T00:00:00+24:00", Some((new_year - 86_400, 0))),
            ("2024-01-01T00:00:00+00:60", Some((new_year - 3600, 0))),
            ("2024-02-29T00:00:00Z", Some((new_year + 59 * 86_400, 0))),
            ("0001-01-01T00:00:00Z", Some((MIN_UNIX, 0))),
            (
                "9999-12-31T23:59:59.999999999Z",
                Some((MAX_UNIX, 999_999_999)),
            ),
            ("1970-01-01T00:00:00Z", Some((0, 0))),
            // what Go's parser or the CEL range refuses
            ("2024-01-01T00:00:00z", None),
            ("2024-01-01t00:00:00Z", None),
            ("2024-01-01 00:00:00Z", None),
            ("2024-01-01T00:00:00", None),
            ("2024-01-01T00:00:00+0100", None),
            ("2024-01-01T00:00:00+1:00", None),
            ("2024-01-01T00:00:00+25:00", None),
            ("2024-01-01T00:00:00+00:61", None),
            ("2024-01-01T24:00:00Z", None),
            ("2024-01-01T00:60:00Z", None),
            ("2024-01-01T00:00:60Z", None),
            ("2024-01-01T01:2:03Z", None),
            ("2024-1-01T00:00:00Z", None),
            ("2023-02-29T00:00:00Z", None),
            ("2024-04-31T00:00:00Z", None),
            ("2024-13-01T00:00:00Z", None),
            ("2024-01-00T00:00:00Z", None),
            ("2024-01-01T00:00:00.Z", None),
            ("2024-01-01T00:00:00Zjunk", None),
            (" 2024-01-01T00:00:00Z", None),
            ("+2024-01-01T00:00:00Z", None),
            ("10000-01-01T00:00:00Z", None),
            ("0000-01-01T00:00:00Z", None),
            ("0001-01-01T00:00:00+01:00", None),
            ("9999-12-31T23:59:59-01:00", None),
        ] {
            assert_eq!(at(text).ok(), want, "{text}");
        }
    }

    #[test]
    fn civil_dates_round_trip() {
        for days in [-719_162, -1, 0, 59, 19_723, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        // 2024-03-10 was a Sunday, the 70th day of the year.
        let days = days_from_civil(2024, 3, 10);
        assert_eq!(Field::DayOfWeek.of(days * 86_400, 0), 0);
        assert_eq!(Field::DayOfYear.of(days * 86_400, 0), 69);
    }
}
