//! A bar chart of the run as an SVG image: horizontal bars on a logarithmic time axis, one
//! section per comparison, kpng's bars in their own colour.

use std::fmt::Write;

/// One bar.
pub struct Bar {
    /// What it measures.
    pub label: String,
    /// Milliseconds.
    pub ms: f64,
    /// Whether it is kpng's.
    pub kpng: bool,
}

/// A titled group of bars.
pub struct Section {
    /// Shown above the bars.
    pub title: String,
    /// The bars, top to bottom.
    pub bars: Vec<Bar>,
}

const LABEL_WIDTH: f64 = 300.0;
const BAR_WIDTH: f64 = 560.0;
const VALUE_WIDTH: f64 = 100.0;
const ROW: f64 = 18.0;
const TITLE: f64 = 30.0;
const AXIS: f64 = 30.0;

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Renders `sections` under `title`; the axis spans the decades the values need.
pub fn svg(title: &str, sections: &[Section]) -> String {
    let values = sections.iter().flat_map(|s| &s.bars).map(|b| b.ms).filter(|v| *v > 0.0);
    let (min, max) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if min <= max {
        (min.log10().floor(), max.log10().ceil().max(min.log10().floor() + 1.0))
    } else {
        (-2.0, 3.0)
    };
    let x = |ms: f64| LABEL_WIDTH + BAR_WIDTH * ((ms.max(10f64.powf(lo)).log10() - lo) / (hi - lo));
    let rows: usize = sections.iter().map(|s| s.bars.len()).sum();
    let height = TITLE + AXIS + sections.len() as f64 * TITLE + rows as f64 * ROW + 20.0;
    let width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{width}" height="{height}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Decade grid and labels.
    let top = TITLE + AXIS;
    for decade in lo as i32..=hi as i32 {
        let gx = x(10f64.powi(decade));
        let label = match decade {
            d if d < 0 => format!("{}", 10f64.powi(d)),
            d => format!("{}", 10u64.pow(d as u32)),
        };
        let _ = writeln!(
            out,
            r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{label} ms</text>"##,
            top - 6.0,
            height - 10.0,
            top - 10.0
        );
    }
    let mut y = top;
    for section in sections {
        y += TITLE;
        let _ = writeln!(
            out,
            r#"<text x="10" y="{:.1}" font-weight="bold">{}</text>"#,
            y - 8.0,
            escape(&section.title)
        );
        for bar in &section.bars {
            let colour = if bar.kpng { "#2a9d4b" } else { "#9aa3ad" };
            let end = x(bar.ms);
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{LABEL_WIDTH}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
                LABEL_WIDTH - 8.0,
                y + ROW - 5.0,
                escape(&bar.label),
                y + 2.0,
                (end - LABEL_WIDTH).max(1.0),
                ROW - 4.0,
                end + 4.0,
                y + ROW - 5.0,
                format_ms(bar.ms)
            );
            y += ROW;
        }
    }
    out.push_str("</svg>\n");
    out
}

/// A value in ms with sensible precision.
fn format_ms(ms: f64) -> String {
    match ms {
        v if v >= 100.0 => format!("{v:.0} ms"),
        v if v >= 1.0 => format!("{v:.1} ms"),
        v => format!("{v:.3} ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_grow_with_their_value_on_a_log_axis() {
        let bar = |label: &str, ms, kpng| Bar { label: label.into(), ms, kpng };
        let sections = [Section {
            title: "a <b>".into(),
            bars: vec![bar("fast", 0.05, true), bar("slow", 5000.0, false)],
        }];
        let svg = svg("t", &sections);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt;"), "titles are escaped");
        let widths: Vec<f64> = svg
            .match_indices(r#"<rect x="300""#)
            .map(|(at, _)| {
                let rest = &svg[at..];
                let w = rest.split("width=\"").nth(1).and_then(|r| r.split('"').next());
                w.and_then(|w| w.parse().ok()).expect("bar width")
            })
            .collect();
        assert_eq!(widths.len(), 2);
        // 0.05 ms and 5 s are 5 decades apart on an axis of 0.01..10,000 ms (6 decades).
        let decade = BAR_WIDTH / 6.0;
        assert!((widths[1] - widths[0] - 5.0 * decade).abs() < 1.0, "{widths:?}");
        assert!(svg.contains("#2a9d4b") && svg.contains("#9aa3ad"));
    }
}
