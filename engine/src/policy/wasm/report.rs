//! What validation found: a report per candidate, and one entry per case it
//! failed. Plain data (no wasmtime types), so errors can carry it and the
//! server can render it.

use std::fmt;

use rewind_policy_sdk::{ResumeFacts, Verdict};

use crate::policy::PolicyFault;

/// The outcome of validating a candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationReport {
    /// The candidate's name.
    pub policy: String,
    /// Cases run (table rows first, then random facts).
    pub cases_run: usize,
    /// Cases planned.
    pub cases_planned: usize,
    /// Cases that failed.
    pub failed: usize,
    /// The first few failures.
    pub failures: Vec<ValidationFailure>,
}

/// One case a candidate failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationFailure {
    /// The facts it was given.
    pub facts: ResumeFacts,
    /// What went wrong: `OutOfSet` (with `code`), or the fault that stopped it.
    pub fault: PolicyFault,
    /// The code it answered, if it answered.
    pub code: Option<u32>,
    /// wasmtime's description of a trap, or the allowed set.
    pub detail: String,
}

impl ValidationReport {
    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

impl ValidationFailure {
    /// The candidate answered `code`, which the facts' safe set does not
    /// admit.
    pub(crate) fn out_of_set(facts: ResumeFacts, code: u32) -> ValidationFailure {
        let allowed: Vec<String> = facts.allowed.iter().map(|v| format!("{v:?}")).collect();
        ValidationFailure {
            facts,
            fault: PolicyFault::OutOfSet,
            code: Some(code),
            detail: format!("allowed: {}", allowed.join(", ")),
        }
    }

    /// The candidate did not answer: `fault` stopped it, and `detail` says
    /// how (wasmtime's description, or empty).
    pub(crate) fn stopped(
        facts: ResumeFacts,
        fault: PolicyFault,
        detail: String,
    ) -> ValidationFailure {
        ValidationFailure {
            facts,
            fault,
            code: None,
            detail,
        }
    }
}

impl fmt::Display for ValidationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.passed() {
            return write!(
                f,
                "policy `{}` passed {} validation cases",
                self.policy, self.cases_run
            );
        }
        write!(
            f,
            "policy `{}` failed {} of {} validation cases run ({} planned)",
            self.policy, self.failed, self.cases_run, self.cases_planned
        )?;
        for failure in &self.failures {
            write!(f, "; {failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationReport {}

impl fmt::Display for ValidationFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let facts = &self.facts;
        write!(
            f,
            "session={} cursor={}",
            name_of_session(facts),
            name_of_cursor(facts)
        )?;
        match self.code {
            Some(code) => write!(f, " -> answered {}", name_of_code(code))?,
            None => write!(f, " -> {}", self.fault)?,
        }
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

fn name_of_session(facts: &ResumeFacts) -> String {
    facts
        .session_fact()
        .map_or_else(|| format!("code {}", facts.session), |s| format!("{s:?}"))
}

fn name_of_cursor(facts: &ResumeFacts) -> String {
    facts
        .cursor_fact()
        .map_or_else(|| format!("code {}", facts.cursor), |c| format!("{c:?}"))
}

fn name_of_code(code: u32) -> String {
    Verdict::from_code(code).map_or_else(
        || format!("code {code} (no such verdict)"),
        |v| format!("{v:?}"),
    )
}
