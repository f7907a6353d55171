//! The OS edge: network namespaces (through ip-netns(8)), TUN devices
//! (Documentation/networking/tuntap.rst), ppoll(2), signals and CPU time.
//! Every `unsafe` block is here, each with its SAFETY note.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::time::Duration;

/// Runs `ip ARGS...`; the error carries ip's own message.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running `ip {}`: {e} (install iproute2)", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

pub fn netns_exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}

// linux/if_tun.h
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// ifreq with the two union members we use (linux/if.h: 16-byte name, then
/// a 24-byte union).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(ifname: &str) -> IfReq {
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        for (d, s) in r
            .name
            .iter_mut()
            .zip(ifname.bytes().take(libc::IFNAMSIZ - 1))
        {
            *d = s as libc::c_char;
        }
        r
    }
    fn set_i32(&mut self, v: i32) {
        self.data[..4].copy_from_slice(&v.to_ne_bytes());
    }
    fn get_i32(&self) -> i32 {
        i32::from_ne_bytes(self.data[..4].try_into().unwrap())
    }
    fn set_i16(&mut self, v: i16) {
        self.data[..2].copy_from_slice(&v.to_ne_bytes());
    }
    fn get_i16(&self) -> i16 {
        i16::from_ne_bytes(self.data[..2].try_into().unwrap())
    }
}

fn ioctl(fd: RawFd, req: libc::c_ulong, r: &mut IfReq, what: &str) -> Result<(), String> {
    // SAFETY: `r` is a valid, writable ifreq-sized buffer for the whole call,
    // and every request we pass (TUNSETIFF, SIOC[GS]IF{MTU,FLAGS}) reads and
    // writes at most one struct ifreq.
    let rc = unsafe { libc::ioctl(fd, req as _, r as *mut IfReq) };
    if rc < 0 {
        return Err(format!("{what}: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// Creates TUN device `ifname` (IFF_TUN | IFF_NO_PI, no vnet header, so no
/// offloads: the kernel segments before handing packets over) inside network
/// namespace `ns`, sets its MTU, checks the MTU it reads back, brings it up,
/// and returns the non-blocking queue descriptor. The work happens on a
/// short-lived thread that enters the namespace (setns(2) changes only the
/// calling thread); the descriptor keeps working from any thread.
pub fn open_tun_in(ns: &str, ifname: &str, mtu: u32) -> Result<OwnedFd, String> {
    let ns = ns.to_string();
    let ifname = ifname.to_string();
    std::thread::spawn(move || -> Result<OwnedFd, String> {
        let nsf = File::open(format!("/run/netns/{ns}"))
            .map_err(|e| format!("open namespace {ns}: {e}"))?;
        // SAFETY: setns on a valid namespace descriptor affects only this
        // thread, which ends when this closure returns.
        if unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
            return Err(format!(
                "setns({ns}): {} (needs root / CAP_SYS_ADMIN)",
                io::Error::last_os_error()
            ));
        }
        let path = CString::new("/dev/net/tun").unwrap();
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(format!(
                "open /dev/net/tun: {} (load the tun module / give the container /dev/net/tun)",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let tun = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut r = IfReq::new(&ifname);
        r.set_i16(IFF_TUN | IFF_NO_PI);
        ioctl(tun.as_raw_fd(), TUNSETIFF, &mut r, "TUNSETIFF")?;
        // SAFETY: plain socket(2) call; the result is checked.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            return Err(format!("socket: {}", io::Error::last_os_error()));
        }
        // SAFETY: `s` was just created and is owned by nothing else.
        let sock = unsafe { OwnedFd::from_raw_fd(s) };
        let mut r = IfReq::new(&ifname);
        r.set_i32(mtu as i32);
        ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFMTU as _,
            &mut r,
            "SIOCSIFMTU",
        )?;
        let mut r = IfReq::new(&ifname);
        ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFMTU as _,
            &mut r,
            "SIOCGIFMTU",
        )?;
        if r.get_i32() != mtu as i32 {
            return Err(format!(
                "{ifname} in {ns}: MTU reads {} after setting {mtu}",
                r.get_i32()
            ));
        }
        let mut r = IfReq::new(&ifname);
        ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as _,
            &mut r,
            "SIOCGIFFLAGS",
        )?;
        let flags = r.get_i16() | libc::IFF_UP as i16;
        r.set_i16(flags);
        ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS as _,
            &mut r,
            "SIOCSIFFLAGS",
        )?;
        Ok(tun)
    })
    .join()
    .map_err(|_| "the namespace setup thread panicked".to_string())?
}

/// read(2) one packet.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// write(2) one packet.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Waits until `fd` is readable or `timeout` passes, with nanosecond
/// resolution (ppoll(2) uses an hrtimer; see `set_timer_slack`).
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(n > 0)
}

/// Timer slack of the calling thread (prctl(2) PR_SET_TIMERSLACK): the
/// default 50 us lets the kernel fire our timers late; 1 ns asks for the
/// hrtimer's own precision.
pub fn set_timer_slack(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it
/// spawns later), so `wait_signal` can take them synchronously.
pub fn block_stop_signals() {
    // SAFETY: a local sigset initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits up to `timeout` for SIGINT or SIGTERM (blocked beforehand).
pub fn wait_signal(timeout: Duration) -> Option<i32> {
    // SAFETY: a local sigset initialised before use; a valid timespec; a
    // null siginfo pointer is allowed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let s = libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
        (s > 0).then_some(s)
    }
}

/// This process's user and system CPU time (getrusage(2) RUSAGE_SELF).
pub fn cpu_time() -> (Duration, Duration) {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// True if process `pid` exists and runs a program named `comm`.
pub fn process_is(pid: i32, comm: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
}

/// Sends SIGTERM to `pid`.
pub fn terminate(pid: i32) {
    // SAFETY: kill(2) with a plain signal number.
    unsafe { libc::kill(pid, libc::SIGTERM) };
}

/// Makes the calling thread SCHED_FIFO at `prio` (sched_setscheduler(2);
/// pid 0 is the calling thread).
pub fn set_fifo(prio: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: a valid sched_param for the duration of the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
