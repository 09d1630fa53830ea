//! Turning a module's wasm into machine code: in this process, or in a
//! child process ([`PolicyCompiler`]).
//!
//! # The child's protocol
//!
//! The host starts the child with its standard streams piped and writes one
//! request on its stdin, then closes it:
//!
//! ```text
//! rewind-policy-compile/1
//! max_wasm_stack_bytes=131072
//! max_address_space_bytes=4294967296 (only if the compiler has a cap)
//! cache_dir=/var/cache/rewind        (only if the host has a cache)
//!                                    (an empty line ends the header)
//! <the module's bytes, to the end of the stream>
//! ```
//!
//! The child ([`compile_child_main`]) caps its own address space
//! (`RLIMIT_AS`, Linux), builds an engine with those settings (the same
//! [`build_engine`] the host uses), compiles the module and answers with
//! its exit status:
//!
//! - 0: stdout holds the compiled module (`Module::serialize`);
//! - 2: the module does not compile; stderr holds wasmtime's error, which
//!   the host reports as [`LoadError::Compile`] (the same words as an
//!   in-process compile);
//! - anything else, or a signal: the child failed, out of memory under
//!   its cap included; stderr says why ([`LoadError::Compiler`]).

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use wasmtime::{Cache, CacheConfig, Config, Engine, Module, OptLevel, Strategy};

use super::config::{ChildCompiler, PolicyCompiler, PolicyHostConfig};
use super::error::{HostError, LoadError};

/// The first line of a request; another version of the protocol changes it.
const REQUEST_MAGIC: &str = "rewind-policy-compile/1";
/// The child's exit status when the module does not compile.
const EXIT_REFUSED: u8 = 2;
/// The child's exit status when it could not do its work.
const EXIT_FAILED: u8 = 3;
/// The most the child reads as a request, and the host as compiled code.
const MAX_BYTES: u64 = 256 << 20;
/// The most of the child's stderr that goes into an error.
const MAX_STDERR_BYTES: u64 = 16 << 10;

/// The wasmtime engine a host with `config` compiles and runs on. The
/// child builds its own from the same settings, so the code it hands back
/// passes wasmtime's compatibility check (which compares the settings that
/// change what compiled code does: fuel, epochs, the stack limit, the
/// target's features).
///
/// A host whose compiler is a child gets an engine without a compiler
/// (`Config::enable_compiler(false)`): creating one would build Cranelift's
/// target description and flags, half a MiB of the compiler's code made
/// resident for nothing, and without it nothing in this process can
/// compile by mistake.
pub(crate) fn build_engine(config: &PolicyHostConfig) -> Result<Engine, HostError> {
    let mut wasm = Config::new();
    wasm.consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(config.max_wasm_stack_bytes);
    match config.compiler {
        PolicyCompiler::ChildProcess(_) => {
            wasm.enable_compiler(false);
        }
        PolicyCompiler::InProcess => {
            wasm.strategy(Strategy::Cranelift)
                .cranelift_opt_level(OptLevel::Speed)
                // A policy is a few functions: compiling them on one thread
                // takes no longer, and parallel compilation would start a
                // rayon pool (one thread per core, each with its stack and
                // malloc arena) that then idles for the life of the process.
                .parallel_compilation(false);
            if let Some(dir) = &config.compilation_cache_dir {
                let mut cache = CacheConfig::new();
                cache.with_directory(dir);
                let cache = Cache::new(cache).map_err(HostError::Engine)?;
                wasm.cache(Some(cache));
            }
        }
    }
    Engine::new(&wasm).map_err(HostError::Engine)
}

/// Compiles `wasm` for `engine`, where `config` says.
pub(crate) fn compile(
    engine: &Engine,
    config: &PolicyHostConfig,
    wasm: &[u8],
) -> Result<Module, LoadError> {
    match &config.compiler {
        PolicyCompiler::InProcess => Module::new(engine, wasm).map_err(LoadError::Compile),
        PolicyCompiler::ChildProcess(child) => compile_in_child(engine, config, child, wasm),
    }
}

/// The `main` of a compiling child (see [`PolicyCompiler::ChildProcess`]
/// and [`ChildCompiler::new`]): reads one request from stdin, writes the
/// compiled module to stdout, and returns the exit status the host reads.
/// A program that embeds the host calls this when started as its compiler,
/// e.g. `rewind` does for its hidden `compile-policy` command.
pub fn compile_child_main() -> ExitCode {
    let mut request = Vec::new();
    if let Err(e) = io::stdin()
        .lock()
        .take(MAX_BYTES + 1)
        .read_to_end(&mut request)
    {
        eprintln!("cannot read the compile request: {e}");
        return ExitCode::from(EXIT_FAILED);
    }
    let Request {
        config,
        memory_limit,
        wasm,
    } = match parse_request(&request) {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    if let Some(bytes) = memory_limit {
        if let Err(e) = cap_address_space(bytes) {
            eprintln!("cannot cap this process's address space at {bytes} bytes: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    }
    let engine = match build_engine(&config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let compiled = match Module::new(&engine, wasm).and_then(|m| m.serialize()) {
        Ok(compiled) => compiled,
        Err(e) if out_of_memory(&e) => {
            // Not the module's fault as far as anyone can tell here: the
            // cap (or the machine) ran out.
            let cap = memory_limit.map_or_else(
                || "no cap".to_owned(),
                |bytes| format!("address space capped at {bytes} bytes"),
            );
            eprintln!("ran out of memory compiling ({cap}): {e:#}");
            return ExitCode::from(EXIT_FAILED);
        }
        Err(e) => {
            // Exactly what an in-process compile's `LoadError::Compile`
            // shows after its prefix.
            eprintln!("{e:#}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let mut stdout = io::stdout().lock();
    match stdout.write_all(&compiled).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write the compiled module: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Whether compiling failed for want of memory (a failed `mmap` or
/// allocation that wasmtime reports instead of aborting).
fn out_of_memory(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| {
        cause.is::<wasmtime::OutOfMemory>()
            || cause.downcast_ref::<io::Error>().is_some_and(|io| {
                io.kind() == io::ErrorKind::OutOfMemory || io.raw_os_error() == Some(12)
            })
    })
}

/// Lowers this process's address-space limit to `bytes` (never raises it).
#[cfg(target_os = "linux")]
fn cap_address_space(bytes: u64) -> io::Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::As);
    let lowered = |limit: Option<u64>| Some(limit.map_or(bytes, |l| l.min(bytes)));
    setrlimit(
        Resource::As,
        Rlimit {
            current: lowered(now.current),
            maximum: lowered(now.maximum),
        },
    )?;
    Ok(())
}

/// No cap where there is no `RLIMIT_AS` this crate sets.
#[cfg(not(target_os = "linux"))]
fn cap_address_space(_bytes: u64) -> io::Result<()> {
    Ok(())
}

/// A parsed request.
#[derive(Debug)]
struct Request<'a> {
    config: PolicyHostConfig,
    memory_limit: Option<u64>,
    wasm: &'a [u8],
}

/// The request's header for a host with `config` and a child capped at
/// `memory_limit` (the module follows it).
fn request_header(config: &PolicyHostConfig, memory_limit: Option<u64>) -> Result<String, String> {
    let mut header = format!(
        "{REQUEST_MAGIC}\nmax_wasm_stack_bytes={}\n",
        config.max_wasm_stack_bytes
    );
    if let Some(bytes) = memory_limit {
        header += &format!("max_address_space_bytes={bytes}\n");
    }
    if let Some(dir) = &config.compilation_cache_dir {
        match dir.to_str() {
            Some(dir) if !dir.contains('\n') => header += &format!("cache_dir={dir}\n"),
            _ => {
                return Err(format!(
                    "cannot be told the compilation cache directory {}: it must be UTF-8 \
                     without line breaks",
                    dir.display()
                ))
            }
        }
    }
    header.push('\n');
    Ok(header)
}

/// Splits a request into the settings to compile with and the module.
fn parse_request(request: &[u8]) -> Result<Request<'_>, String> {
    if request.len() as u64 > MAX_BYTES {
        return Err(format!("the compile request is over {MAX_BYTES} bytes"));
    }
    let end = request
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or("the compile request has no header (no empty line)")?;
    let header = std::str::from_utf8(&request[..end])
        .map_err(|_| "the compile request's header is not UTF-8")?;
    let mut lines = header.lines();
    if lines.next() != Some(REQUEST_MAGIC) {
        return Err(format!(
            "not a compile request of this version (expected the first line {REQUEST_MAGIC:?})"
        ));
    }
    let mut config = PolicyHostConfig::default();
    let mut memory_limit = None;
    for line in lines {
        match line.split_once('=') {
            Some(("max_wasm_stack_bytes", n)) => {
                config.max_wasm_stack_bytes = n
                    .parse()
                    .map_err(|_| format!("max_wasm_stack_bytes={n:?} is not a size"))?;
            }
            Some(("max_address_space_bytes", n)) => {
                memory_limit = Some(
                    n.parse()
                        .map_err(|_| format!("max_address_space_bytes={n:?} is not a size"))?,
                );
            }
            Some(("cache_dir", dir)) => config.compilation_cache_dir = Some(PathBuf::from(dir)),
            _ => return Err(format!("unknown line {line:?} in the compile request")),
        }
    }
    Ok(Request {
        config,
        memory_limit,
        wasm: &request[end + 2..],
    })
}

/// What the child left behind.
struct ChildOutput {
    status: ExitStatus,
    stdout: Vec<u8>,
    /// Bytes of stdout past [`MAX_BYTES`], read and dropped.
    stdout_over: u64,
    stderr: String,
    sent: io::Result<()>,
}

fn compile_in_child(
    engine: &Engine,
    config: &PolicyHostConfig,
    child: &ChildCompiler,
    wasm: &[u8],
) -> Result<Module, LoadError> {
    let fail = |problem: String, source: Option<Box<dyn std::error::Error + Send + Sync>>| {
        LoadError::Compiler {
            program: child.program.clone(),
            problem,
            source,
        }
    };
    let header =
        request_header(config, child.memory_limit).map_err(|problem| fail(problem, None))?;
    let output = run_child(child, header.as_bytes(), wasm).map_err(|(problem, e)| {
        let source = e.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        fail(problem, source)
    })?;
    let said = |stderr: &str| match stderr.trim_end() {
        "" => String::new(),
        text => format!(": {text}"),
    };
    match output.status.code() {
        Some(0) => {}
        Some(code) if code == i32::from(EXIT_REFUSED) => {
            return Err(LoadError::Compile(wasmtime::Error::msg(
                output.stderr.trim_end().to_owned(),
            )));
        }
        code => {
            let mut problem = format!("failed ({}){}", output.status, said(&output.stderr));
            if let (None, Some(bytes)) = (code, child.memory_limit) {
                // Running into the cap often ends in a signal (a stack that
                // cannot grow, an abort on a failed allocation), not a
                // message.
                problem += &format!(
                    " (its address space is capped at {bytes} bytes; a compile that needs \
                     more ends this way)"
                );
            }
            return Err(fail(problem, None));
        }
    }
    if let Err(e) = output.sent {
        let problem = format!("exited 0 before reading the whole module: {e}");
        return Err(fail(problem, Some(Box::new(e))));
    }
    if output.stdout_over > 0 {
        let problem = format!(
            "handed back {} bytes of compiled code, over the {MAX_BYTES}-byte limit",
            MAX_BYTES + output.stdout_over
        );
        return Err(fail(problem, None));
    }
    // SAFETY: `ChildCompiler::new`, the only way to a `ChildProcess`
    // compiler, is `unsafe`; its caller promised that the program answers
    // as `compile_child_main` does, built with this crate and so with this
    // wasmtime. Exit status 0 means it wrote `Module::serialize`'s output
    // for an engine built by `build_engine` from this host's settings, which
    // is what `Module::deserialize` requires. wasmtime also checks the
    // version and compiler settings recorded in the bytes and refuses
    // others (the error below).
    unsafe { Module::deserialize(engine, &output.stdout) }.map_err(|e| {
        let problem = format!("handed back code this host cannot load: {e:#}");
        fail(problem, Some(e.into()))
    })
}

/// Runs the child on one request and collects what it wrote, killing it
/// after the timeout. Errors: what went wrong, and the OS error if any.
fn run_child(
    child: &ChildCompiler,
    header: &[u8],
    wasm: &[u8],
) -> Result<ChildOutput, (String, Option<io::Error>)> {
    let mut process = Command::new(&child.program)
        .args(&child.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| (format!("could not be started: {e}"), Some(e)))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (
        process.stdin.take(),
        process.stdout.take(),
        process.stderr.take(),
    ) else {
        unreachable!("all three streams were asked to be piped");
    };
    // Each stream has its own thread, so that neither side can block the
    // other on a full pipe; this thread waits for the child's end.
    std::thread::scope(|threads| {
        let sender = threads.spawn(move || {
            stdin.write_all(header)?;
            stdin.write_all(wasm)
            // Dropping `stdin` closes it: the child reads to its end.
        });
        let stdout = threads.spawn(move || read_capped(stdout, MAX_BYTES));
        let stderr = threads.spawn(move || read_capped(stderr, MAX_STDERR_BYTES));
        // A timeout too long to add to the clock waits without one.
        let waited = wait_until(&mut process, Instant::now().checked_add(child.timeout));
        let status = match waited {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err((
                format!("did not finish within {:?} and was killed", child.timeout),
                None,
            )),
            Err(e) => Err((format!("could not be waited for: {e}"), Some(e))),
        };
        if status.is_err() {
            // Ending the child closes its pipes, which ends the threads.
            let _ = process.kill();
            let _ = process.wait();
        }
        let sent = join(sender);
        let (stdout, stdout_over) = join(stdout);
        let (stderr, _) = join(stderr);
        Ok(ChildOutput {
            status: status?,
            stdout,
            stdout_over,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            sent,
        })
    })
}

/// Waits for `process` to end, until `deadline` (if any); `None` if it is
/// still running then.
///
/// Polls, with pauses growing from 0.5 to 10 ms: a compile takes tens of
/// milliseconds, so that is a few dozen wake-ups. Blocking with a timeout
/// instead would need a `SIGCHLD` handler, and a library has no business
/// installing one for the whole process it is embedded in.
fn wait_until(process: &mut Child, deadline: Option<Instant>) -> io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_micros(500);
    loop {
        if let Some(status) = process.try_wait()? {
            return Ok(Some(status));
        }
        let left = match deadline {
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => left,
                _ => return Ok(None),
            },
            None => pause,
        };
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// What a stream's thread returned (its panic goes on in this thread).
fn join<T>(thread: std::thread::ScopedJoinHandle<'_, T>) -> T {
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Reads `stream` to its end, keeping the first `cap` bytes; returns them
/// and how many more there were. Reading on past the cap lets the writer
/// finish instead of blocking on a full pipe. A read error ends the stream
/// early (the exit status then tells what happened).
fn read_capped(stream: impl Read, cap: u64) -> (Vec<u8>, u64) {
    let mut stream = stream.take(cap);
    let mut kept = Vec::new();
    let _ = stream.read_to_end(&mut kept);
    let over = io::copy(&mut stream.into_inner(), &mut io::sink()).unwrap_or(0);
    (kept, over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failed_allocation_counts_as_running_out_of_memory() {
        let oom = wasmtime::Error::from(wasmtime::OutOfMemory::new(1 << 20));
        assert!(out_of_memory(&oom));
        // However deep in the chain, as wasmtime wraps it in context.
        let mmap = wasmtime::Error::from(io::Error::from_raw_os_error(12))
            .context("failed to allocate the code memory")
            .context("compiling the module");
        assert!(out_of_memory(&mmap));
        let kind = wasmtime::Error::from(io::Error::from(io::ErrorKind::OutOfMemory));
        assert!(out_of_memory(&kind));
        // What a module's own faults look like is not memory.
        for other in [
            wasmtime::Error::msg("invalid leading byte in type definition"),
            wasmtime::Error::from(io::Error::from_raw_os_error(13)).context("mmap"),
            wasmtime::Error::from(io::Error::from(io::ErrorKind::InvalidData)),
        ] {
            assert!(!out_of_memory(&other), "{other:#}");
        }
    }

    #[test]
    fn a_request_parses_back_to_the_settings_it_was_written_from() {
        let config = PolicyHostConfig::default()
            .max_wasm_stack_bytes(65_536)
            .compilation_cache_dir(Some("/tmp/cache dir".into()));
        let mut request = request_header(&config, Some(1 << 30)).unwrap().into_bytes();
        request.extend_from_slice(b"\0asm\n\nbytes");
        let parsed = parse_request(&request).unwrap();
        assert_eq!(parsed.config.max_wasm_stack_bytes, 65_536);
        assert_eq!(
            parsed.config.compilation_cache_dir,
            config.compilation_cache_dir
        );
        assert_eq!(parsed.memory_limit, Some(1 << 30));
        assert_eq!(parsed.wasm, b"\0asm\n\nbytes");
        let request = request_header(&PolicyHostConfig::default(), None).unwrap();
        assert_eq!(
            parse_request(request.as_bytes()).unwrap().memory_limit,
            None
        );
    }

    #[test]
    fn a_request_without_the_header_is_refused_with_a_reason() {
        let err = parse_request(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(err.contains("no header"), "{err}");
        let err = parse_request(b"rewind-policy-compile/9\n\n\0asm").unwrap_err();
        assert!(
            err.contains("not a compile request of this version"),
            "{err}"
        );
        let err = parse_request(b"rewind-policy-compile/1\nfuel=3\n\n").unwrap_err();
        assert!(err.contains("unknown line \"fuel=3\""), "{err}");
        let err =
            parse_request(b"rewind-policy-compile/1\nmax_wasm_stack_bytes=x\n\n").unwrap_err();
        assert!(err.contains("is not a size"), "{err}");
    }

    #[test]
    fn a_cache_directory_with_a_line_break_cannot_be_sent() {
        let config = PolicyHostConfig::default().compilation_cache_dir(Some("a\nb".into()));
        let err = request_header(&config, None).unwrap_err();
        assert!(err.contains("without line breaks"), "{err}");
    }
}
