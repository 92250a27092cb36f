//! The figures of a soak benchmark: named series sampled over the run's minutes, printed as a table with each
//! series' least-squares slope per hour while the churn ran (every sample but the first, taken before it, and
//! the last, taken once everything was deleted) and over the second half of those.

/// Named series, one value of each per sample.
#[derive(Debug, Default)]
pub struct Series {
    minutes: Vec<f64>,
    names: Vec<&'static str>,
    values: Vec<Vec<f64>>,
}

/// The least-squares slope of `ys` over `xs`, per unit of `xs` (0 with fewer than two distinct points).
pub fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len().min(ys.len()) as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// The machine's load averages (1, 5, 15 minutes).
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl Series {
    /// One sample at `minute`: a value per name (the same names, in the same order, every time).
    pub fn push(&mut self, minute: f64, sample: &[(&'static str, f64)]) {
        if self.names.is_empty() {
            self.names = sample.iter().map(|(n, _)| *n).collect();
            self.values = vec![Vec::new(); sample.len()];
        }
        assert_eq!(
            self.names,
            sample.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "every sample names the same series"
        );
        self.minutes.push(minute);
        for (column, (_, value)) in self.values.iter_mut().zip(sample) {
            column.push(*value);
        }
    }

    /// The last sample as one line (`minute name=value ...`).
    pub fn last_line(&self) -> String {
        let mut line = format!("{:6.1} min", self.minutes.last().copied().unwrap_or(0.0));
        for (name, column) in self.names.iter().zip(&self.values) {
            line.push_str(&format!(" {name}={}", fmt(column.last().copied().unwrap_or(0.0))));
        }
        line
    }

    /// Every sample, then per series: first, last, minimum, maximum, and the slope per hour while the churn ran
    /// and over the second half of that.
    pub fn print(&self) {
        println!("samples:");
        for i in 0..self.minutes.len() {
            let mut line = format!("  {:6.1} min", self.minutes[i]);
            for (name, column) in self.names.iter().zip(&self.values) {
                line.push_str(&format!(" {name}={}", fmt(column[i])));
            }
            println!("{line}");
        }
        let churn = 1..self.minutes.len().saturating_sub(1).max(1);
        let span = &self.minutes[churn.clone()];
        let half = (span.first().copied().unwrap_or(0.0) + span.last().copied().unwrap_or(0.0)) / 2.0;
        let from = churn.start + span.iter().position(|m| *m >= half).unwrap_or(0);
        let to = churn.end;
        println!(
            "| series | first | last | min | max | slope per hour, churn | slope per hour, churn's second half |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for (name, column) in self.names.iter().zip(&self.values) {
            let min = column.iter().copied().fold(f64::INFINITY, f64::min);
            let max = column.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            println!(
                "| {name} | {} | {} | {} | {} | {:+.2} | {:+.2} |",
                fmt(column[0]),
                fmt(*column.last().unwrap_or(&0.0)),
                fmt(min),
                fmt(max),
                slope(span, &column[churn.clone()]) * 60.0,
                slope(&self.minutes[from..to], &column[from..to]) * 60.0,
            );
        }
    }
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        assert!((slope(&[0.0, 1.0, 2.0, 3.0], &[1.0, 3.0, 5.0, 7.0]) - 2.0).abs() < 1e-9);
        assert_eq!(slope(&[0.0, 1.0, 2.0], &[4.0, 4.0, 4.0]), 0.0);
        assert_eq!(slope(&[1.0], &[4.0]), 0.0);
    }
}
