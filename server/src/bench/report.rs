//! A workload's result: throughput, MB/s, latency percentiles from the HDR
//! histogram, errors, and the verification line; as a human summary or as
//! one JSON object.

use serde_json::{json, Map, Value};

use super::context::Ctx;
use super::driver::Tally;
use super::progress::group_digits;

/// What one workload measured and whether its result checked out.
pub struct Report {
    /// "w1", "w2", "w3", "w4", "mixed".
    pub workload: &'static str,
    /// One line: what ran, at which scale.
    pub title: String,
    /// The workload's parameters (connections, groups, ...).
    pub params: Map<String, Value>,
    /// Setup phases (not measured), each `(what, seconds)`.
    pub setup: Vec<(String, f64)>,
    /// Unit of `ops` ("sends", "deliveries", "acks", "queries").
    pub unit: &'static str,
    pub tally: Tally,
    pub measured_secs: f64,
    pub cut_short: bool,
    pub verified: bool,
    pub verification: String,
    /// Further figures (e.g. commit rounds, pushes received). The human
    /// summary prints the scalar ones; objects are for `--json`, with
    /// `table` saying the same to a reader.
    pub extra: Map<String, Value>,
    /// Lines of the human summary after the latency line (the population
    /// workload's table).
    pub table: Vec<String>,
}

impl Report {
    /// A report before the run: the common parameters (`Ctx::common_params`)
    /// and then the workload's, nothing measured or verified yet.
    pub(crate) fn new(
        ctx: &Ctx<'_>,
        workload: &'static str,
        title: String,
        params: Map<String, Value>,
        unit: &'static str,
    ) -> Report {
        let mut p = ctx.common_params();
        p.extend(params);
        Report {
            workload,
            title,
            params: p,
            setup: Vec::new(),
            unit,
            tally: Tally::new(),
            measured_secs: 0.0,
            cut_short: false,
            verified: false,
            verification: String::new(),
            extra: Map::new(),
            table: Vec::new(),
        }
    }

    pub fn ops_per_sec(&self) -> f64 {
        self.tally.ops as f64 / self.measured_secs.max(1e-9)
    }

    pub fn mb_per_sec(&self) -> f64 {
        self.tally.payload_bytes as f64 / 1e6 / self.measured_secs.max(1e-9)
    }

    fn quantile(&self, q: f64) -> u64 {
        self.tally.latency_us.value_at_quantile(q)
    }

    pub fn to_json(&self) -> Value {
        let h = &self.tally.latency_us;
        let mut v = json!({
            "workload": self.workload,
            "title": self.title,
            "params": Value::Object(self.params.clone()),
            "setup_secs": self.setup.iter().map(|(w, s)| json!({"what": w, "secs": s})).collect::<Vec<_>>(),
            "measured_secs": self.measured_secs,
            "unit": self.unit,
            "ops": self.tally.ops,
            "ops_per_sec": self.ops_per_sec(),
            "payload_bytes": self.tally.payload_bytes,
            "mb_per_sec": self.mb_per_sec(),
            "requests": self.tally.requests,
            "requests_per_sec": self.tally.requests as f64 / self.measured_secs.max(1e-9),
            "latency_us": {
                "p50": self.quantile(0.5),
                "p90": self.quantile(0.9),
                "p99": self.quantile(0.99),
                "p999": self.quantile(0.999),
                "max": h.max(),
                "mean": h.mean(),
                "count": h.len(),
            },
            "errors": self.tally.errors,
            "error_samples": self.tally.error_samples,
            "cut_short": self.cut_short,
            "verified": self.verified,
            "verification": self.verification,
        });
        if let Value::Object(m) = &mut v {
            for (k, x) in &self.extra {
                m.insert(k.clone(), x.clone());
            }
        }
        v
    }

    pub fn human(&self) -> String {
        let mut s = String::new();
        let h = &self.tally.latency_us;
        s.push_str(&format!("{}\n", self.title));
        for (what, secs) in &self.setup {
            s.push_str(&format!("  setup     {what}: {secs:.2} s\n"));
        }
        s.push_str(&format!(
            "  measured  {} {} in {:.2} s{}: {} {}/s, {:.1} MB/s payload, {} requests\n",
            group_digits(self.tally.ops),
            self.unit,
            self.measured_secs,
            if self.cut_short {
                " (stopped by --duration)"
            } else {
                ""
            },
            group_digits(self.ops_per_sec() as u64),
            self.unit,
            self.mb_per_sec(),
            group_digits(self.tally.requests),
        ));
        s.push_str(&format!(
            "  latency   per request: p50 {} us, p90 {} us, p99 {} us, p99.9 {} us, max {} us\n",
            group_digits(self.quantile(0.5)),
            group_digits(self.quantile(0.9)),
            group_digits(self.quantile(0.99)),
            group_digits(self.quantile(0.999)),
            group_digits(h.max()),
        ));
        for line in &self.table {
            s.push_str(&format!("  {line}\n"));
        }
        for (k, v) in &self.extra {
            match v {
                Value::String(text) => s.push_str(&format!("  {k:<9} {text}\n")),
                Value::Object(_) | Value::Array(_) => {}
                v => s.push_str(&format!("  {k:<9} {v}\n")),
            }
        }
        s.push_str(&format!("  errors    {}", self.tally.errors));
        for e in &self.tally.error_samples {
            s.push_str(&format!("\n            e.g. {e}"));
        }
        s.push('\n');
        s.push_str(&format!(
            "  verify    {}: {}\n",
            if self.verified { "OK" } else { "FAILED" },
            self.verification
        ));
        s
    }
}
