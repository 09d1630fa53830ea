//! Validation of a candidate before it goes live: it must answer every row
//! of the decision table and a seeded stream of random facts without a trap,
//! within budget, and only with verdicts each row's safe set admits (the
//! same [`VerdictSet::admit`](rewind_policy_sdk::VerdictSet::admit) check
//! the hot path and the engine's clamp apply).

use super::config::PolicyHostConfig;
use super::instance::PolicyInstance;
use super::module::PolicyModule;
use super::report::{ValidationFailure, ValidationReport};
use super::vectors::{decision_table, RandomFacts};
use crate::policy::PolicyFault;

/// Failures kept in a report; the rest are only counted.
const LISTED_FAILURES: usize = 8;
/// A candidate this broken is not worth running to the end (a looping one
/// would burn its whole budget on every case).
const STOP_AFTER_FAILURES: usize = 32;

/// Runs `policy` on the validation vectors with the host's budgets.
pub(crate) fn validate(config: &PolicyHostConfig, policy: &PolicyModule) -> ValidationReport {
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
            None => PolicyInstance::new(policy.wasm(), config).map(|i| instance.insert(i)),
        };
        let failure = match outcome {
            Err(e) => Some(ValidationFailure::stopped(
                facts,
                PolicyFault::Unavailable,
                e.to_string(),
            )),
            Ok(i) => match i.call(&facts) {
                Ok(code) if facts.allowed.contains_code(code) => None,
                Ok(code) => Some(ValidationFailure::out_of_set(facts, code)),
                Err(failure) => {
                    // A faulted instance may be corrupt: start the next case
                    // on a fresh one, as the hot path does.
                    instance = None;
                    let detail = failure.error.map(|e| format!("{e:#}")).unwrap_or_default();
                    Some(ValidationFailure::stopped(facts, failure.fault, detail))
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
