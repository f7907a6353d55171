//! Where a download goes: the output (a file or standard output) and the
//! progress bar.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use iwarp::MemoryRegion;

pub(crate) fn bar(quiet: bool, len: u64, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Where a response body goes: a file or standard output. The plain-HTTP
/// path writes through a 64 KiB buffer (it batches the socket reads); an
/// RDMA body is written straight from the registered buffer to the
/// descriptor ([`copy_out`]).
pub(crate) struct Sink {
    out: io::BufWriter<Out>,
}

enum Out {
    File(File),
    Stdout(io::Stdout),
}

impl Write for Out {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Out::File(f) => f.write(b),
            Out::Stdout(o) => o.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Out::File(f) => f.flush(),
            Out::Stdout(o) => o.flush(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.out.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Sink {
    /// The descriptor, with everything buffered before it written out.
    pub(crate) fn fd(&mut self) -> io::Result<BorrowedFd<'_>> {
        self.out.flush()?;
        Ok(match self.out.get_ref() {
            Out::File(f) => f.as_fd(),
            Out::Stdout(o) => o.as_fd(),
        })
    }
}

pub(crate) fn open_sink(path: &PathBuf) -> Result<Sink, String> {
    let out = if path.as_os_str() == "-" {
        Out::Stdout(io::stdout())
    } else {
        Out::File(File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?)
    };
    Ok(Sink {
        out: io::BufWriter::with_capacity(64 << 10, out),
    })
}

/// Write `len` bytes of the registered buffer, from offset `at`, to `sink`.
///
/// Straight from the registered memory to the file or pipe with `write(2)`
/// ([`MemoryRegion::write_to_fd`]): no copy in user space, and no Rust
/// slice of memory that stays registered for the next request (a
/// misbehaving server could still be writing into it).
pub(crate) fn copy_out(
    buf: &MemoryRegion,
    at: usize,
    len: u64,
    sink: &mut Sink,
) -> Result<(), String> {
    let fd = sink.fd().map_err(|e| e.to_string())?;
    let mut off = 0usize;
    let len = usize::try_from(len).map_err(|_| "body larger than the address space")?;
    while off < len {
        match buf.write_to_fd(at + off, len - off, fd) {
            Ok(0) => return Err("writing the body: the output accepted no bytes".into()),
            Ok(n) => off += n,
            Err(e) => return Err(format!("writing the body: {e}")),
        }
    }
    Ok(())
}
