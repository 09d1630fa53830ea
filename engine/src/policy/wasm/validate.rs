//! Validation of a candidate before it goes live: it must answer every row
//! of the decision table and a seeded stream of random facts without a trap,
//! within budget, and only with verdicts each row's safe set admits (the
//! same [`VerdictSet::admit`](rewind_policy_sdk::VerdictSet::admit) check
//! the hot path and the engine's clamp apply).

use std::fmt;

use rewind_policy_sdk::{ResumeFacts, Verdict};
use wasmtime::Engine;

use super::config::PolicyHostConfig;
use super::instance::PolicyInstance;
use super::module::PolicyModule;
use super::vectors::{decision_table, RandomFacts};
use crate::policy::PolicyFault;

/// Failures kept in a report; the rest are only counted.
const LISTED_FAILURES: usize = 8;
/// A candidate this broken is not worth running to the end (a looping one
/// would burn its whole budget on every case).
const STOP_AFTER_FAILURES: usize = 32;

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

fn allowed_names(facts: &ResumeFacts) -> String {
    let names: Vec<String> = facts.allowed.iter().map(|v| format!("{v:?}")).collect();
    format!("allowed: {}", names.join(", "))
}

/// Runs `policy` on the validation vectors with the host's budgets.
pub(crate) fn validate(
    engine: &Engine,
    config: &PolicyHostConfig,
    policy: &PolicyModule,
) -> ValidationReport {
    let table = decision_table();
    let cases_planned = table.len() + config.validation_random_cases;
    let cases = table
        .into_iter()
        .chain(RandomFacts::new(config.validation_seed).take(config.validation_random_cases));
    let mut report = ValidationReport {
        policy: policy.name().to_owned(),
        cases_run: 0,
        cases_planned,
        failed: 0,
        failures: Vec::new(),
    };
    let mut instance = None;
    for facts in cases {
        if report.failed >= STOP_AFTER_FAILURES {
            break;
        }
        report.cases_run += 1;
        let outcome = match &mut instance {
            Some(i) => Ok(i),
            None => PolicyInstance::new(engine, policy, config).map(|i| instance.insert(i)),
        };
        let failure = match outcome {
            Err(e) => Some(ValidationFailure {
                facts,
                fault: PolicyFault::Unavailable,
                code: None,
                detail: e.to_string(),
            }),
            Ok(i) => match i.call_detailed(&facts, true) {
                Ok(code) if facts.allowed.contains_code(code) => None,
                Ok(code) => Some(ValidationFailure {
                    facts,
                    fault: PolicyFault::OutOfSet,
                    code: Some(code),
                    detail: allowed_names(&facts),
                }),
                Err(failure) => {
                    // A faulted instance may be corrupt: start the next case
                    // on a fresh one, as the hot path does.
                    instance = None;
                    Some(ValidationFailure {
                        facts,
                        fault: failure.fault,
                        code: None,
                        detail: failure.detail,
                    })
                }
            },
        };
        if let Some(failure) = failure {
            report.failed += 1;
            if report.failures.len() < LISTED_FAILURES {
                report.failures.push(failure);
            }
        }
    }
    report
}
