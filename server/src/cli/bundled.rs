//! `rewind policy list` and `rewind policy export`: the policy plugins built
//! into the program, as files an operator can check, edit the source of, or
//! push.
//!
//! The engine's build compiles every `plugins/*` crate to wasm and embeds
//! the modules (`rewind_engine::policy::wasm::plugins`); this module names
//! them and writes them out byte for byte.

use std::fs::OpenOptions;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use comfy_table::{presets, Table};
use rewind_engine::policy::wasm::plugins::{self, fixtures};

use super::CommandError;

/// One plugin built into the program.
#[derive(Debug, Clone, Copy)]
pub struct BundledPlugin {
    /// The name `export` takes (the plugin's directory under `plugins/`).
    pub name: &'static str,
    /// What it decides.
    pub description: &'static str,
    /// The module.
    pub wasm: &'static [u8],
    /// A hostile module for testing the host, never for production.
    pub fixture: bool,
}

const fn policy(
    name: &'static str,
    description: &'static str,
    wasm: &'static [u8],
) -> BundledPlugin {
    BundledPlugin {
        name,
        description,
        wasm,
        fixture: false,
    }
}

const fn fixture(
    name: &'static str,
    description: &'static str,
    wasm: &'static [u8],
) -> BundledPlugin {
    BundledPlugin {
        name,
        description,
        wasm,
        fixture: true,
    }
}

/// Every plugin built into the program: the policies first, then the
/// hostile fixtures the host must contain.
pub const BUNDLED: &[BundledPlugin] = &[
    policy(
        "default",
        "The default decision table (what `rewind serve` runs unless told otherwise).",
        plugins::DEFAULT,
    ),
    policy(
        "strict",
        "Any doubt is a rejection: a client that lost continuity gets 404 instead of a \
         `reset`/`gap` stream; no resume past `max_resume_age_secs` or with an unknown cursor age.",
        plugins::STRICT,
    ),
    policy(
        "status-400",
        "The default table, answering 400 where it would answer 409 (for clients that loop on 409).",
        plugins::STATUS_400,
    ),
    fixture(
        "fixture-loop",
        "Never returns (stopped by fuel and the deadline).",
        fixtures::LOOP,
    ),
    fixture("fixture-trap", "Traps on every decision.", fixtures::TRAP),
    fixture(
        "fixture-memory-bomb",
        "Grows its memory until the cap stops it.",
        fixtures::MEMORY_BOMB,
    ),
    fixture(
        "fixture-deep-recursion",
        "Recurses until the wasm stack limit stops it.",
        fixtures::DEEP_RECURSION,
    ),
    fixture(
        "fixture-wrong-abi",
        "Declares an ABI version the host does not speak (refused at load).",
        fixtures::WRONG_ABI,
    ),
    fixture(
        "fixture-imports",
        "Imports a host function (refused at load).",
        fixtures::IMPORTS,
    ),
    fixture(
        "fixture-out-of-range",
        "Answers a verdict code that does not exist.",
        fixtures::OUT_OF_RANGE,
    ),
    fixture(
        "fixture-resume-all",
        "Answers `Resume` to everything, foreign cursors included (clamped to the safe set).",
        fixtures::RESUME_ALL,
    ),
    fixture(
        "fixture-empty",
        "Returns a constant without reading the facts (the benchmarks' call floor).",
        fixtures::EMPTY,
    ),
];

/// The bundled plugin called `name`.
pub fn find(name: &str) -> Option<&'static BundledPlugin> {
    BUNDLED.iter().find(|p| p.name == name)
}

/// `rewind policy list`: a table of the bundled policies (and, with
/// `fixtures`, the hostile fixtures).
pub fn list(fixtures: bool) -> String {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(["name", "bytes", "description"]);
    for plugin in BUNDLED.iter().filter(|p| fixtures || !p.fixture) {
        table.add_row([
            plugin.name.to_owned(),
            plugin.wasm.len().to_string(),
            plugin.description.to_owned(),
        ]);
    }
    let mut out = table.trim_fmt();
    out.push_str("\n\n`rewind policy export NAME` writes one to NAME.wasm");
    if !fixtures {
        out.push_str("; `--fixtures` also lists the hostile test modules");
    }
    out.push('\n');
    out
}

/// Where `export` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportTarget {
    /// A file.
    File(PathBuf),
    /// Standard output (`-o -`).
    Stdout,
}

impl ExportTarget {
    /// `-o` as given (`-` is standard output), or `NAME.wasm` in the current
    /// directory.
    pub fn from_arg(output: Option<&Path>, name: &str) -> ExportTarget {
        match output {
            Some(path) if path == Path::new("-") => ExportTarget::Stdout,
            Some(path) => ExportTarget::File(path.to_owned()),
            None => ExportTarget::File(PathBuf::from(format!("{name}.wasm"))),
        }
    }
}

/// `rewind policy export`: writes the bundled plugin `name` to `target`.
/// An existing file is kept unless `overwrite`. Returns the line to print
/// (on standard error when the module went to standard output).
pub fn export(name: &str, target: &ExportTarget, overwrite: bool) -> Result<String, CommandError> {
    let plugin = find(name).ok_or_else(|| {
        let names: Vec<&str> = BUNDLED.iter().map(|p| p.name).collect();
        CommandError(format!(
            "no bundled plugin is called `{name}`; the bundled plugins are: {} (see `rewind policy list --fixtures`)",
            names.join(", ")
        ))
    })?;
    let warning = if plugin.fixture {
        " (a hostile test fixture: a server refuses it or contains it; never run it in production)"
    } else {
        ""
    };
    match target {
        ExportTarget::Stdout => {
            let mut stdout = std::io::stdout().lock();
            if stdout.is_terminal() {
                return Err(CommandError(
                    "refusing to write a binary module to a terminal; redirect standard output or pass `-o FILE`"
                        .to_owned(),
                ));
            }
            stdout
                .write_all(plugin.wasm)
                .and_then(|()| stdout.flush())
                .map_err(|e| CommandError(format!("cannot write to standard output: {e}")))?;
            Ok(format!(
                "wrote `{name}` ({} bytes) to standard output{warning}",
                plugin.wasm.len()
            ))
        }
        ExportTarget::File(path) => {
            let mut options = OpenOptions::new();
            options.write(true);
            if overwrite {
                options.create(true).truncate(true);
            } else {
                options.create_new(true);
            }
            let mut file = options.open(path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    CommandError(format!(
                        "{} already exists; left as it is (pass --force to overwrite it, or -o to write elsewhere)",
                        path.display()
                    ))
                } else {
                    CommandError(format!("cannot create {}: {e}", path.display()))
                }
            })?;
            file.write_all(plugin.wasm)
                .and_then(|()| file.sync_all())
                .map_err(|e| CommandError(format!("cannot write {}: {e}", path.display())))?;
            Ok(format!(
                "wrote `{name}` ({} bytes) to {}{warning}",
                plugin.wasm.len(),
                path.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_module_is_listed_once_under_a_unique_name() {
        let mut names: Vec<&str> = BUNDLED.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUNDLED.len());
        // 3 policies + the 9 fixtures of `plugins::fixtures`.
        assert_eq!(BUNDLED.iter().filter(|p| !p.fixture).count(), 3);
        assert_eq!(BUNDLED.iter().filter(|p| p.fixture).count(), 9);
        for plugin in BUNDLED {
            assert!(plugin.wasm.starts_with(b"\0asm"), "{}", plugin.name);
        }
    }

    #[test]
    fn the_list_shows_policies_and_hides_fixtures_unless_asked() {
        let policies = list(false);
        for name in ["default", "strict", "status-400"] {
            assert!(policies.contains(name), "{policies}");
        }
        assert!(!policies.contains("fixture-loop"), "{policies}");
        assert!(policies.contains(&plugins::STRICT.len().to_string()));
        assert!(list(true).contains("fixture-loop"));
    }

    #[test]
    fn dash_means_standard_output_and_no_output_means_name_dot_wasm() {
        assert_eq!(
            ExportTarget::from_arg(Some(Path::new("-")), "strict"),
            ExportTarget::Stdout
        );
        assert_eq!(
            ExportTarget::from_arg(None, "strict"),
            ExportTarget::File(PathBuf::from("strict.wasm"))
        );
    }
}
