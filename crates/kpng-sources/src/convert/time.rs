//! RFC 3339 timestamps (`metadata.creationTimestamp`) as Unix seconds.

/// The Unix time (seconds, fractions dropped) of an RFC 3339 timestamp such as
/// `2024-05-01T12:30:00Z` or `2024-05-01T14:30:00.5+02:00`.
pub fn unix_seconds(text: &str) -> Result<i64, String> {
    let invalid = || format!("{text:?} is not an RFC 3339 time (like 2024-05-01T12:30:00Z)");
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return Err(invalid());
    }
    let number = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = text.get(range).ok_or_else(invalid)?;
        match part.bytes().all(|b| b.is_ascii_digit()) {
            true => part.parse().map_err(|_| invalid()),
            false => Err(invalid()),
        }
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators.iter().any(|(at, c)| bytes[*at] != *c) {
        return Err(invalid());
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let days_in_month = match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return Err(invalid()),
    };
    if !(1..=days_in_month).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return Err(invalid());
    }
    // Fractional seconds, then the offset.
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        rest = &fraction[digits..];
    }
    let offset = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let minutes =
                number(text.len() - 5..text.len() - 3)? * 60 + number(text.len() - 2..text.len())?;
            if *sign == b'+' { minutes * 60 } else { -minutes * 60 }
        }
        _ => return Err(invalid()),
    };
    let days = days_from_civil(year, month, day);
    Ok(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_become_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(unix_seconds("2024-02-29T12:00:00Z"), Ok(1_709_208_000));
        assert_eq!(unix_seconds("2024-02-29T14:00:00.123+02:00"), Ok(1_709_208_000));
        assert_eq!(unix_seconds("2024-02-29T11:30:00-00:30"), Ok(1_709_208_000));
        for bad in ["2023-02-29T00:00:00Z", "2024-13-01T00:00:00Z", "yesterday", "2024-01-01"] {
            assert!(unix_seconds(bad).is_err(), "{bad}");
        }
    }
}
