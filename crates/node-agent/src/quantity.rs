//! Kubernetes resource quantities: parsing, exact arithmetic, canonical formatting.
//!
//! This module owns the conversion between the API's quantity strings (`"100Mi"`, `"1500m"`, `"10%"` is *not*
//! a quantity) and exact integer values, so that `allocatable = capacity - reserved - eviction threshold` comes
//! out digit for digit as the kubelet writes it. Values are held in milli-units (`1` = `1000` milli), which is
//! the finest precision the node side needs; finer suffixes (`n`, `u`) round up to the next milli-unit.
//!
//! Formatting follows the API's canonical form: a binary-suffixed quantity prints with the largest binary
//! suffix that divides it exactly (`16318464Ki`, else plain bytes), a decimal one with the largest decimal
//! suffix (`4`, `1500m`, `4k`).

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is not a quantity.
    #[error(
        "quantity {0:?} is not a valid quantity (expected a number with an optional suffix, e.g. 100Mi, 250m, 2)"
    )]
    Invalid(String),
    /// The value does not fit.
    #[error("quantity {0:?} is out of range")]
    OutOfRange(String),
}

/// How a quantity prints: the suffix family it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Powers of 1024: Ki, Mi, Gi, Ti, Pi, Ei.
    BinarySI,
    /// Powers of 1000: m, (none), k, M, G, T, P, E.
    DecimalSI,
    /// Exponent notation: 1e3.
    DecimalExponent,
}

/// An exact resource quantity in milli-units with its print format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quantity {
    milli: i128,
    format: Format,
}

const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];
const DECIMAL: [(&str, i32); 9] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

impl Quantity {
    /// A whole number of units (bytes, cores, pods) printed in `format`.
    pub fn from_units(units: i64, format: Format) -> Self {
        Self {
            milli: i128::from(units) * 1000,
            format,
        }
    }

    /// A number of milli-units (e.g. millicores), printed decimal.
    pub fn from_milli(milli: i64) -> Self {
        Self {
            milli: i128::from(milli),
            format: Format::DecimalSI,
        }
    }

    /// Zero, printed decimal.
    pub fn zero() -> Self {
        Self {
            milli: 0,
            format: Format::DecimalSI,
        }
    }

    /// The value in milli-units.
    pub fn milli(&self) -> i128 {
        self.milli
    }

    /// The value in whole units, rounded up (the API's `Value()`).
    pub fn value(&self) -> i128 {
        self.milli.div_euclid(1000) + i128::from(self.milli.rem_euclid(1000) != 0)
    }

    /// The print format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.milli < 0
    }

    /// `self - other`, keeping `self`'s format.
    pub fn saturating_sub(&self, other: &Quantity) -> Quantity {
        Quantity {
            milli: self.milli.saturating_sub(other.milli),
            format: self.format,
        }
    }

    /// `self + other`, keeping `self`'s format.
    pub fn saturating_add(&self, other: &Quantity) -> Quantity {
        Quantity {
            milli: self.milli.saturating_add(other.milli),
            format: self.format,
        }
    }

    /// This value clamped at zero.
    pub fn non_negative(self) -> Quantity {
        Quantity {
            milli: self.milli.max(0),
            format: self.format,
        }
    }

    /// `fraction` (0.1 = 10 %) of this value in whole units, truncated, printed binary — computed in the same
    /// floating-point widths the kubelet uses for percentage eviction thresholds, so results match it exactly.
    pub fn fraction(&self, fraction: f32) -> Quantity {
        let units = (self.value() as f64) * f64::from(fraction);
        Quantity {
            milli: (units as i128) * 1000,
            format: Format::BinarySI,
        }
    }

    /// The API form.
    pub fn to_api(&self) -> ApiQuantity {
        ApiQuantity(self.to_string())
    }

    /// Parses the API form.
    pub fn from_api(q: &ApiQuantity) -> Result<Self, QuantityError> {
        q.0.parse()
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || QuantityError::Invalid(input.to_owned());
        let range = || QuantityError::OutOfRange(input.to_owned());
        let s = input.trim();
        if s.is_empty() {
            return Err(invalid());
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid());
        }
        // mantissa * 10^-scale
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let digits = format!("{int_part}{frac_part}");
        if digits.len() > 30 {
            return Err(range());
        }
        let mantissa: i128 = digits.parse().map_err(|_| invalid())?;
        let scale = frac_part.len() as i32;

        // value = mantissa * 10^(exp10 - scale) * 2^exp2
        let (exp10, exp2, format) = if suffix.is_empty() {
            (0, 0, Format::DecimalSI)
        } else if let Some((_, shift)) = BINARY.iter().find(|(name, _)| *name == suffix) {
            (0, *shift, Format::BinarySI)
        } else if let Some((_, e)) = DECIMAL.iter().find(|(name, _)| *name == suffix) {
            (*e, 0, Format::DecimalSI)
        } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
            let e: i32 = exp.parse().map_err(|_| invalid())?;
            if !(-30..=30).contains(&e) {
                return Err(range());
            }
            (e, 0, Format::DecimalExponent)
        } else {
            return Err(invalid());
        };

        // milli = mantissa * 2^exp2 * 10^(exp10 - scale + 3), rounded up.
        let numerator = mantissa
            .checked_mul(1i128.checked_shl(exp2).ok_or_else(range)?)
            .ok_or_else(range)?;
        let power = exp10 - scale + 3;
        let magnitude = if power >= 0 {
            numerator
                .checked_mul(10i128.checked_pow(power as u32).ok_or_else(range)?)
                .ok_or_else(range)?
        } else {
            let div = 10i128.checked_pow((-power) as u32).ok_or_else(range)?;
            numerator / div + i128::from(numerator % div != 0)
        };
        let milli = if negative { -magnitude } else { magnitude };
        Ok(Self { milli, format })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let milli = self.milli;
        if milli == 0 {
            return f.write_str("0");
        }
        let whole = milli % 1000 == 0;
        match self.format {
            Format::BinarySI if whole => {
                let v = milli / 1000;
                for (name, shift) in BINARY.iter().rev() {
                    let unit = 1i128 << shift;
                    if v % unit == 0 {
                        return write!(f, "{}{name}", v / unit);
                    }
                }
                write!(f, "{v}")
            }
            Format::DecimalExponent if whole => {
                let v = milli / 1000;
                let mut exp = 0;
                let mut m = v;
                while m % 1000 == 0 && exp < 18 {
                    m /= 1000;
                    exp += 3;
                }
                if exp == 0 {
                    write!(f, "{v}")
                } else {
                    write!(f, "{m}e{exp}")
                }
            }
            _ => {
                // Decimal: the largest power of 1000 that divides the milli value.
                let mut m = milli;
                let mut exp = -3;
                while m % 1000 == 0 && exp < 18 {
                    m /= 1000;
                    exp += 3;
                }
                let suffix = match exp {
                    -3 => "m",
                    0 => "",
                    3 => "k",
                    6 => "M",
                    9 => "G",
                    12 => "T",
                    15 => "P",
                    _ => "E",
                };
                write!(f, "{m}{suffix}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn parses_suffixes() {
        assert_eq!(q("100Mi").value(), 100 * 1024 * 1024);
        assert_eq!(q("250m").milli(), 250);
        assert_eq!(q("2").milli(), 2000);
        assert_eq!(q("1.5").milli(), 1500);
        assert_eq!(q("1.5Gi").value(), 1536 * 1024 * 1024);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("1n").milli(), 1, "rounds up to a milli-unit");
        assert_eq!(q("-5").milli(), -5000);
        assert_eq!(q("0").milli(), 0);
        for bad in ["", "Mi", "1.2.3", "12Q", "abc", "1e", "--1"] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(q("7845568Ki").to_string(), "7845568Ki");
        assert_eq!(q("16318464Ki").to_string(), "15936Mi");
        assert_eq!(q("16Gi").to_string(), "16Gi");
        assert_eq!(q("1024Ki").to_string(), "1Mi");
        assert_eq!(q("4").to_string(), "4");
        assert_eq!(q("4000m").to_string(), "4");
        assert_eq!(q("3900m").to_string(), "3900m");
        assert_eq!(q("110").to_string(), "110");
        assert_eq!(q("4000").to_string(), "4k");
        assert_eq!(Quantity::from_units(1000, Format::BinarySI).to_string(), "1000");
        assert_eq!(Quantity::from_units(0, Format::BinarySI).to_string(), "0");
    }

    #[test]
    fn subtraction_keeps_capacity_format_like_the_kubelet() {
        // memory 2039724Ki - 100Mi = 1937324Ki
        assert_eq!(
            q("2039724Ki").saturating_sub(&q("100Mi")).to_string(),
            "1937324Ki"
        );
        // cpu 2 - 70m = 1930m
        assert_eq!(q("2").saturating_sub(&q("70m")).to_string(), "1930m");
        // ephemeral-storage minus 10 %: plain bytes when no binary suffix divides it
        let cap = q("20263484Ki");
        let alloc = cap.saturating_sub(&cap.fraction(10.0f32 / 100.0));
        assert_eq!(alloc.to_string(), "18674826824");
        assert!(q("1").saturating_sub(&q("2")).non_negative().milli() == 0);
    }
}
