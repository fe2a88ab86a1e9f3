//! [`LibNftApplier`]: batches committed in-process by libnftables, the library the `nft`
//! command is built on: the same syntax, the same error messages, the same one netlink
//! batch per script, without starting a process for each (which cost 10-19 ms a batch).
//!
//! The library is loaded when the applier opens (`libnftables.so.1`, shipped with the
//! `nftables` package), so kpng builds without its headers and a machine without it gets
//! a clear error (`kpng aggregate` then runs `nft` instead). Its context lives on a thread
//! of its own, which first enters the network namespace asked for: the context and its
//! netlink socket never move between threads, and each call is one round trip on a
//! channel.
//!
//! This module is the crate's only unsafe code: the library's C functions, called with
//! NUL-terminated strings and the context they returned.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::mpsc;

use crate::applier::{Applier, NftError, parse_table_line};
use crate::diff::Script;
use crate::model::TableKey;

/// The library's file name.
pub const LIBRARY: &str = "libnftables.so.1";
const LIBRARY_C: &CStr = c"libnftables.so.1";

/// `NFT_CTX_OUTPUT_STATELESS`: listings without counter values (`nft -s`).
const OUTPUT_STATELESS: c_uint = 1 << 2;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type SetDryRun = unsafe extern "C" fn(*mut c_void, bool);
type GetFlags = unsafe extern "C" fn(*mut c_void) -> c_uint;
type SetFlags = unsafe extern "C" fn(*mut c_void, c_uint);
type Buffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// The library's functions kpng calls, resolved once.
struct Library {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    set_dry_run: SetDryRun,
    output_get_flags: GetFlags,
    output_set_flags: SetFlags,
    buffer_output: Buffer,
    get_output_buffer: GetBuffer,
    buffer_error: Buffer,
    get_error_buffer: GetBuffer,
    run_cmd_from_buffer: RunCmd,
    run_cmd_from_filename: RunCmd,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, read at once.
    let text = unsafe { libc::dlerror() };
    match text.is_null() {
        true => "unknown error".into(),
        // SAFETY: checked non-NULL above; libc keeps it valid until the next dl* call.
        false => unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned(),
    }
}

impl Library {
    fn load() -> Result<Library, String> {
        // SAFETY: a NUL-terminated name; the handle is never closed, so the functions
        // resolved from it stay valid for the life of the process.
        let handle = unsafe { libc::dlopen(LIBRARY_C.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("{LIBRARY} could not be loaded: {}", dl_error()));
        }
        let symbol = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: a valid handle and a NUL-terminated name.
            let found = unsafe { libc::dlsym(handle, name.as_ptr()) };
            match found.is_null() {
                true => Err(format!("{LIBRARY} has no {}: {}", name.to_string_lossy(), dl_error())),
                false => Ok(found),
            }
        };
        // SAFETY: each symbol is the libnftables function of that name, whose C signature
        // (libnftables.h) the field's type spells.
        unsafe {
            Ok(Library {
                ctx_new: std::mem::transmute::<*mut c_void, CtxNew>(symbol(c"nft_ctx_new")?),
                ctx_free: std::mem::transmute::<*mut c_void, CtxFree>(symbol(c"nft_ctx_free")?),
                set_dry_run: std::mem::transmute::<*mut c_void, SetDryRun>(symbol(
                    c"nft_ctx_set_dry_run",
                )?),
                output_get_flags: std::mem::transmute::<*mut c_void, GetFlags>(symbol(
                    c"nft_ctx_output_get_flags",
                )?),
                output_set_flags: std::mem::transmute::<*mut c_void, SetFlags>(symbol(
                    c"nft_ctx_output_set_flags",
                )?),
                buffer_output: std::mem::transmute::<*mut c_void, Buffer>(symbol(
                    c"nft_ctx_buffer_output",
                )?),
                get_output_buffer: std::mem::transmute::<*mut c_void, GetBuffer>(symbol(
                    c"nft_ctx_get_output_buffer",
                )?),
                buffer_error: std::mem::transmute::<*mut c_void, Buffer>(symbol(
                    c"nft_ctx_buffer_error",
                )?),
                get_error_buffer: std::mem::transmute::<*mut c_void, GetBuffer>(symbol(
                    c"nft_ctx_get_error_buffer",
                )?),
                run_cmd_from_buffer: std::mem::transmute::<*mut c_void, RunCmd>(symbol(
                    c"nft_run_cmd_from_buffer",
                )?),
                run_cmd_from_filename: std::mem::transmute::<*mut c_void, RunCmd>(symbol(
                    c"nft_run_cmd_from_filename",
                )?),
            })
        }
    }
}

/// A context, on the thread that made it.
struct Context {
    lib: Library,
    ctx: *mut c_void,
}

impl Context {
    fn new(lib: Library) -> Result<Context, String> {
        // SAFETY: `nft_ctx_new(NFT_CTX_DEFAULT)`; the result is checked, then configured
        // while no other code holds it.
        unsafe {
            let ctx = (lib.ctx_new)(0);
            if ctx.is_null() {
                return Err("nft_ctx_new failed".into());
            }
            let buffered = (lib.buffer_output)(ctx) == 0 && (lib.buffer_error)(ctx) == 0;
            if !buffered {
                (lib.ctx_free)(ctx);
                return Err("libnftables could not buffer its output".into());
            }
            let flags = (lib.output_get_flags)(ctx);
            (lib.output_set_flags)(ctx, flags | OUTPUT_STATELESS);
            Ok(Context { lib, ctx })
        }
    }

    /// Runs `text`: a command (a listing), or a script, which is read from a file in
    /// memory so that errors name its line and quote it as `nft -f` does (the library
    /// quotes a buffer's first line whatever line failed). Its output, or its error text.
    fn run(&mut self, text: &str, script: bool, dry_run: bool) -> Result<String, String> {
        let file = match script {
            true => Some(script_file(text)?),
            false => None,
        };
        let path = match &file {
            Some(file) => format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file)),
            None => String::new(),
        };
        let text = CString::new(text).map_err(|_| "a NUL byte in the script".to_string())?;
        let path = CString::new(path).map_err(|_| "a NUL byte in the path".to_string())?;
        // SAFETY: the context is this thread's own; the strings are NUL-terminated and
        // outlive the calls; the buffers returned are copied before the next call.
        unsafe {
            (self.lib.set_dry_run)(self.ctx, dry_run);
            let status = match script {
                true => (self.lib.run_cmd_from_filename)(self.ctx, path.as_ptr()),
                false => (self.lib.run_cmd_from_buffer)(self.ctx, text.as_ptr()),
            };
            (self.lib.set_dry_run)(self.ctx, false);
            let read = |buffer: *const c_char| match buffer.is_null() {
                true => String::new(),
                false => CStr::from_ptr(buffer).to_string_lossy().into_owned(),
            };
            let output = read((self.lib.get_output_buffer)(self.ctx));
            let error = read((self.lib.get_error_buffer)(self.ctx));
            match status {
                0 => Ok(output),
                _ => Err(error.trim().to_string()),
            }
        }
    }
}

/// `text` in a file in memory, to be read back by its `/proc/self/fd` path.
fn script_file(text: &str) -> Result<std::fs::File, String> {
    use std::io::Write;
    let fd = nix::sys::memfd::memfd_create(c"kpng-batch", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| format!("creating the batch's file in memory: {e}"))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(text.as_bytes()).map_err(|e| format!("writing the batch's file: {e}"))?;
    Ok(file)
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context came from nft_ctx_new and is freed once.
        unsafe { (self.lib.ctx_free)(self.ctx) }
    }
}

/// A script or command to run, and where the answer goes.
struct Request {
    text: String,
    script: bool,
    dry_run: bool,
    answer: mpsc::Sender<Result<String, String>>,
}

/// Commits through libnftables in this process.
#[derive(Debug)]
pub struct LibNftApplier {
    requests: mpsc::Sender<Request>,
}

impl LibNftApplier {
    /// Loads libnftables and opens a context in this network namespace, or in the named
    /// one (`/run/netns/NAME`, as `ip netns` makes them).
    pub fn open(netns: Option<&str>) -> Result<LibNftApplier, NftError> {
        let (requests, received) = mpsc::channel::<Request>();
        let (opened, open) = mpsc::channel();
        let netns = netns.map(|name| format!("/run/netns/{name}"));
        let thread = std::thread::Builder::new().name("libnftables".into()).spawn(move || {
            let context = enter(netns.as_deref()).and_then(|()| Context::new(Library::load()?));
            let mut context = match context {
                Ok(context) => {
                    let _ = opened.send(Ok(()));
                    context
                }
                Err(error) => {
                    let _ = opened.send(Err(error));
                    return;
                }
            };
            while let Ok(request) = received.recv() {
                let answer = context.run(&request.text, request.script, request.dry_run);
                let large = request.text.len().max(answer.as_ref().map_or(0, String::len));
                // Trimmed before answering, so that a caller that reads the resident set
                // once its call returned sees the parse given back.
                if large >= LARGE {
                    kpng_runner::release_free_memory();
                }
                let _ = request.answer.send(answer);
            }
        });
        let failed = |message: String| NftError { message };
        thread.map_err(|e| failed(format!("starting the libnftables thread: {e}")))?;
        let opened = open.recv().map_err(|_| failed("the libnftables thread ended".into()))?;
        opened.map_err(failed)?;
        Ok(LibNftApplier { requests })
    }

    fn run(
        &self,
        text: String,
        script: bool,
        dry_run: bool,
        what: &str,
    ) -> Result<String, NftError> {
        let (answer, answered) = mpsc::channel();
        let gone = || NftError { message: "the libnftables thread ended".into() };
        let request = Request { text, script, dry_run, answer };
        self.requests.send(request).map_err(|_| gone())?;
        let answer = answered.recv().map_err(|_| gone())?;
        answer.map_err(|message| NftError {
            message: format!("libnftables: {what} failed: {message}"),
        })
    }
}

/// The size of a script or listing (bytes of text) after which the pages its parse used
/// are given back: about 20,000 elements. libnftables parses a script into about a kilobyte
/// and a half per element and frees it when the call returns, but the C allocator keeps
/// those pages mapped: after `to-nft`'s first publication at 30,000 services the
/// aggregator held 0.9 GiB, of which its own state was a sixth.
const LARGE: usize = 1 << 20;

/// Enters the network namespace at `path`, for this thread only.
fn enter(path: Option<&str>) -> Result<(), String> {
    let Some(path) = path else { return Ok(()) };
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("entering {path}: {e}"))
}

impl Applier for LibNftApplier {
    fn commit(&mut self, script: &Script) -> Result<(), NftError> {
        self.run(script.to_string(), true, false, "the batch").map(drop)
    }

    fn check(&mut self, script: &Script) -> Result<(), NftError> {
        self.run(script.to_string(), true, true, "checking the batch").map(drop)
    }

    fn tables(&mut self) -> Result<Vec<TableKey>, NftError> {
        let listed = self.run("list tables".into(), false, false, "list tables")?;
        Ok(listed.lines().filter_map(parse_table_line).collect())
    }

    fn ruleset(&mut self) -> Result<String, NftError> {
        self.run("list ruleset".into(), false, false, "list ruleset")
    }
}
