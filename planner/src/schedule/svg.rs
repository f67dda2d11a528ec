//! A small, dependency-free SVG line chart of a learning-rate schedule (and OneCycle's
//! momentum on a secondary axis): axes, "nice" ticks with short labels, a title.

use std::fmt::Write as _;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 58.0;
const BOTTOM: f64 = 50.0;
const LR_COLOUR: &str = "#1f6fc5";
const MOMENTUM_COLOUR: &str = "#d9640b";

/// An SVG document plotting `points` (step, learning rate) and, when given, `momentum`
/// (step, β₁) against a right-hand axis. Non-finite values are left out of the lines.
pub fn lr_curve_svg(points: &[(u64, f64)], momentum: Option<&[(u64, f64)]>, title: &str) -> String {
    let lr: Vec<(u64, f64)> = finite(points);
    let mom: Option<Vec<(u64, f64)>> = momentum.map(finite);
    let all_steps = lr
        .iter()
        .chain(mom.iter().flatten())
        .map(|(step, _)| *step as f64);
    let x_axis = Axis::spanning(all_steps, AxisKind::Steps);
    let y_lr = Axis::spanning(
        lr.iter().map(|(_, v)| *v).chain(std::iter::once(0.0)),
        AxisKind::Values,
    );
    let y_mom = mom
        .as_ref()
        .map(|m| Axis::spanning(m.iter().map(|(_, v)| *v), AxisKind::Values));

    let plot = Plot {
        x: x_axis,
        left: LEFT,
        right: WIDTH - RIGHT,
        top: TOP,
        bottom: HEIGHT - BOTTOM,
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<title>{}</title>"#, escape(title));
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    plot.frame(&mut svg, &y_lr, y_mom.as_ref());
    if lr.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#888">no data</text>"##,
            (plot.left + plot.right) / 2.0,
            (plot.top + plot.bottom) / 2.0
        );
    } else {
        plot.line(&mut svg, "lr", LR_COLOUR, "", &lr, &y_lr);
    }
    if let (Some(mom), Some(axis)) = (&mom, &y_mom) {
        plot.line(
            &mut svg,
            "momentum",
            MOMENTUM_COLOUR,
            r#" stroke-dasharray="6 3""#,
            mom,
            axis,
        );
    }
    plot.legend(&mut svg, mom.is_some());
    svg.push_str("</svg>\n");
    svg
}

fn finite(points: &[(u64, f64)]) -> Vec<(u64, f64)> {
    points
        .iter()
        .copied()
        .filter(|(_, v)| v.is_finite())
        .collect()
}

/// Whether an axis counts steps (integer ticks) or carries values.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AxisKind {
    Steps,
    Values,
}

/// A linear axis with round ticks covering its data.
struct Axis {
    low: f64,
    high: f64,
    step: f64,
    kind: AxisKind,
}

impl Axis {
    fn spanning(values: impl Iterator<Item = f64>, kind: AxisKind) -> Axis {
        let (mut low, mut high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        if !low.is_finite() || !high.is_finite() {
            (low, high) = (0.0, 1.0);
        }
        if high - low <= high.abs().max(low.abs()) * 1e-12 {
            // A flat series: widen around it, without crossing zero when it is non-negative.
            let non_negative = low >= 0.0;
            let pad = if high == 0.0 { 1.0 } else { high.abs() * 0.1 };
            (low, high) = (low - pad, high + pad);
            if non_negative {
                low = low.max(0.0);
            }
        }
        let mut step = nice_step((high - low) / 5.0);
        if kind == AxisKind::Steps {
            // Steps: the axis spans the data exactly; ticks are the round steps inside it.
            step = step.max(1.0);
            return Axis {
                low,
                high,
                step,
                kind,
            };
        }
        Axis {
            low: (low / step).floor() * step,
            high: (high / step).ceil() * step,
            step,
            kind,
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let first = (self.low / self.step - 1e-9).ceil() as i64;
        let last = (self.high / self.step + 1e-9).floor() as i64;
        (first..=last).map(|i| i as f64 * self.step).collect()
    }

    fn fraction(&self, value: f64) -> f64 {
        (value - self.low) / (self.high - self.low)
    }

    fn label(&self, value: f64) -> String {
        match self.kind {
            AxisKind::Steps => step_label(value, self.low.abs().max(self.high.abs())),
            AxisKind::Values => value_label(
                value,
                self.step,
                uses_decimals(self.low, self.high, self.step),
            ),
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || raw.is_infinite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let mantissa = raw / magnitude;
    let nice = if mantissa <= 1.0 {
        1.0
    } else if mantissa <= 2.0 {
        2.0
    } else if mantissa <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// Step counts, in one unit per axis (`largest` is the axis' largest magnitude): `250`,
/// `5k`/`12k`, `1.5M`.
fn step_label(value: f64, largest: f64) -> String {
    let trim = |x: f64| {
        let text = format!("{x:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if value == 0.0 {
        "0".to_string()
    } else if largest >= 1e6 {
        format!("{}M", trim(value / 1e6))
    } else if largest >= 1e4 {
        format!("{}k", trim(value / 1e3))
    } else {
        format!("{value:.0}")
    }
}

/// How a value axis writes its labels: decimals for ordinary magnitudes (`0.25`, `0.0010`),
/// otherwise scientific (`2.5e-5`), the same for every tick of the axis.
fn uses_decimals(low: f64, high: f64, step: f64) -> bool {
    let largest = low.abs().max(high.abs());
    let magnitude = largest.log10().floor() as i32;
    let step_exponent = step.log10().floor() as i32;
    (-3..5).contains(&magnitude) && step_exponent >= -4
}

/// One value-axis label with as many digits as the tick step needs.
fn value_label(value: f64, step: f64, decimals: bool) -> String {
    if value.abs() < step * 1e-9 {
        return "0".to_string();
    }
    let step_exponent = step.log10().floor() as i32;
    if decimals {
        let places = (-step_exponent).max(0) as usize;
        return format!("{value:.places$}");
    }
    let exponent = value.abs().log10().floor() as i32;
    let digits = (exponent - step_exponent).max(0) as usize;
    let text = format!("{value:.digits$e}");
    match text.split_once('e') {
        Some((mantissa, exp)) if mantissa.contains('.') => {
            format!(
                "{}e{exp}",
                mantissa.trim_end_matches('0').trim_end_matches('.')
            )
        }
        _ => text,
    }
}

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// The plotting area and the horizontal axis.
struct Plot {
    x: Axis,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Plot {
    fn px(&self, step: f64) -> f64 {
        self.left + self.x.fraction(step) * (self.right - self.left)
    }

    fn py(&self, axis: &Axis, value: f64) -> f64 {
        self.bottom - axis.fraction(value) * (self.bottom - self.top)
    }

    /// Axes, grid, ticks and axis titles.
    fn frame(&self, svg: &mut String, lr: &Axis, momentum: Option<&Axis>) {
        let (l, r, t, b) = (self.left, self.right, self.top, self.bottom);
        let _ = writeln!(svg, r##"<g stroke="#e6e6e6" stroke-width="1">"##);
        for tick in lr.ticks() {
            let y = self.py(lr, tick);
            let _ = writeln!(svg, r#"<line x1="{l}" y1="{y:.2}" x2="{r}" y2="{y:.2}"/>"#);
        }
        let _ = writeln!(svg, "</g>");
        let _ = writeln!(svg, r##"<g stroke="#333" stroke-width="1" fill="none">"##);
        let _ = writeln!(svg, r#"<line x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>"#);
        let _ = writeln!(svg, r#"<line x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>"#);
        if momentum.is_some() {
            let _ = writeln!(svg, r#"<line x1="{r}" y1="{t}" x2="{r}" y2="{b}"/>"#);
        }
        let _ = writeln!(svg, "</g>");

        let _ = writeln!(
            svg,
            r##"<g class="x-ticks" fill="#333" text-anchor="middle">"##
        );
        for tick in self.x.ticks() {
            let x = self.px(tick);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.2}" y1="{b}" x2="{x:.2}" y2="{}" stroke="#333"/><text x="{x:.2}" y="{}">{}</text>"##,
                b + 5.0,
                b + 19.0,
                self.x.label(tick)
            );
        }
        let _ = writeln!(svg, "</g>");
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#333">step</text>"##,
            (l + r) / 2.0,
            HEIGHT - 10.0
        );

        self.value_ticks(svg, "lr-ticks", lr, l, -1.0, LR_COLOUR);
        let _ = writeln!(
            svg,
            r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle" fill="{LR_COLOUR}">learning rate</text>"#,
            (t + b) / 2.0
        );
        if let Some(axis) = momentum {
            self.value_ticks(svg, "momentum-ticks", axis, r, 1.0, MOMENTUM_COLOUR);
            let _ = writeln!(
                svg,
                r#"<text transform="translate({} {}) rotate(90)" text-anchor="middle" fill="{MOMENTUM_COLOUR}">momentum (β₁)</text>"#,
                WIDTH - 14.0,
                (t + b) / 2.0
            );
        }
    }

    /// Ticks and labels of a value axis at `x`, drawn towards `direction` (-1 left, 1 right).
    fn value_ticks(
        &self,
        svg: &mut String,
        class: &str,
        axis: &Axis,
        x: f64,
        direction: f64,
        colour: &str,
    ) {
        let anchor = if direction < 0.0 { "end" } else { "start" };
        let _ = writeln!(
            svg,
            r#"<g class="{class}" fill="{colour}" text-anchor="{anchor}">"#
        );
        for tick in axis.ticks() {
            let y = self.py(axis, tick);
            let _ = writeln!(
                svg,
                r#"<line x1="{x}" y1="{y:.2}" x2="{}" y2="{y:.2}" stroke="{colour}"/><text x="{}" y="{:.2}">{}</text>"#,
                x + 5.0 * direction,
                x + 8.0 * direction,
                y + 4.0,
                axis.label(tick)
            );
        }
        let _ = writeln!(svg, "</g>");
    }

    fn line(
        &self,
        svg: &mut String,
        class: &str,
        colour: &str,
        extra: &str,
        points: &[(u64, f64)],
        axis: &Axis,
    ) {
        let _ = write!(
            svg,
            r#"<polyline class="{class}" fill="none" stroke="{colour}" stroke-width="1.5"{extra} points=""#
        );
        for (i, (step, value)) in points.iter().enumerate() {
            if i > 0 {
                svg.push(' ');
            }
            let _ = write!(
                svg,
                "{:.2},{:.2}",
                self.px(*step as f64),
                self.py(axis, *value)
            );
        }
        svg.push_str("\"/>\n");
    }

    /// A one-row legend between the title and the plot.
    fn legend(&self, svg: &mut String, with_momentum: bool) {
        let x = self.left;
        let y = TOP - 16.0;
        let _ = writeln!(
            svg,
            r#"<g class="legend"><line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{LR_COLOUR}" stroke-width="2"/><text x="{}" y="{}">learning rate</text>"#,
            x + 24.0,
            x + 30.0,
            y + 4.0
        );
        if with_momentum {
            let x2 = x + 140.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{x2}" y1="{y}" x2="{}" y2="{y}" stroke="{MOMENTUM_COLOUR}" stroke-width="2" stroke-dasharray="6 3"/><text x="{}" y="{}">momentum (β₁)</text>"#,
                x2 + 24.0,
                x2 + 30.0,
                y + 4.0
            );
        }
        let _ = writeln!(svg, "</g>");
    }
}

#[cfg(test)]
mod tests;
