//! JUnit XML, so CI systems show one test case per optimizer step (and the final weights)
//! for each comparison.

use std::fmt::Write;

use super::{escape_xml, fraction, num, ulps, Exporter};
use crate::judge::Outcome;
use crate::judge::{Agreement, Comparison, GroupDiff};

pub struct Junit;

fn case(s: &mut String, suite: &str, name: &str, g: &GroupDiff, o: &Outcome) {
    let _ = write!(s, "    <testcase classname=\"ddp-verify.{}\" name=\"{}\"", escape_xml(suite), escape_xml(name));
    if g.verdict != Agreement::Diverged {
        let _ = writeln!(s, "/>");
        return;
    }
    let worst: Vec<String> = g
        .tensors
        .iter()
        .filter(|t| t.verdict == Agreement::Diverged)
        .map(|t| {
            t.problem.clone().map_or_else(
                || {
                    let (abs, rel, used) = (num(t.max_abs), num(t.max_rel), fraction(t.worst_fraction));
                    format!(
                        "{}: max |Δ| {abs}, rel {rel}, {} ulp, {used} times the allowed difference",
                        t.name,
                        ulps(t.max_ulps)
                    )
                },
                |p| format!("{}: {p}", t.name),
            )
        })
        .collect();
    let message = format!("{name} diverged (allowed: {})", super::bound_words(o));
    let _ = writeln!(
        s,
        ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
        escape_xml(&message),
        escape_xml(&worst.join("\n"))
    );
}

/// (tests, failures): a case per step, one for the final weights, one if step counts differ.
fn counts(c: &Comparison) -> (usize, usize) {
    let mismatch = usize::from(c.left_steps != c.right_steps);
    let failed = c.steps.iter().chain([&c.finals]).filter(|g| g.verdict == Agreement::Diverged).count();
    (c.steps.len() + 1 + mismatch, failed + mismatch)
}

fn suite(s: &mut String, c: &Comparison, o: &Outcome) {
    let name = format!("{} vs {}", c.left, c.right);
    let count_mismatch = c.left_steps != c.right_steps;
    let (tests, failures) = counts(c);
    let _ = writeln!(s, "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\">", escape_xml(&name));
    let key = name.replace(' ', "-");
    for (i, g) in c.steps.iter().enumerate() {
        case(s, &key, &format!("step {i}"), g, o);
    }
    case(s, &key, "final weights", &c.finals, o);
    if count_mismatch {
        let msg = format!("{} made {} optimizer steps, {} made {}", c.left, c.left_steps, c.right, c.right_steps);
        let _ = writeln!(
            s,
            "    <testcase classname=\"ddp-verify.{}\" name=\"step count\">\n      <failure message=\"{}\"/>\n    </testcase>",
            escape_xml(&key),
            escape_xml(&msg)
        );
    }
    let _ = writeln!(s, "  </testsuite>");
}

impl Exporter for Junit {
    fn render(&self, o: &Outcome) -> String {
        if let Some(why) = &o.no_verdict {
            // An error, not a failure: nothing was judged (exit 4).
            return format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ddp-verify\" tests=\"1\" failures=\"0\" errors=\"1\">\n  \
                 <testsuite name=\"ddp-verify.kernels\" tests=\"1\" failures=\"0\" errors=\"1\">\n    \
                 <testcase classname=\"ddp-verify.kernels\" name=\"kernels repeat themselves\">\n      \
                 <error message=\"{}\"/>\n    </testcase>\n  </testsuite>\n</testsuites>\n",
                escape_xml(&why.line())
            );
        }
        let mut body = String::new();
        let all = o.comparisons();
        for c in &all {
            suite(&mut body, c, o);
        }
        let (tests, failures) = all.iter().map(|c| counts(c)).fold((0, 0), |(t, f), (a, b)| (t + a, f + b));
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ddp-verify\" tests=\"{tests}\" failures=\"{failures}\">\n{body}</testsuites>\n"
        )
    }
}
