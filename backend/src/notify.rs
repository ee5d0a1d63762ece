//! Telling the service manager (systemd's `Type=notify`) that the daemon
//! is ready, and which process is the daemon after a live upgrade: one
//! datagram to `$NOTIFY_SOCKET`, as `sd_notify(3)` sends it. Without that
//! variable (not started by systemd) nothing is sent.

use std::os::unix::net::UnixDatagram;

use log::warn;

/// Sends `state` (newline-separated `KEY=value` assignments).
fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|s| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                s.send_to_addr(state.as_bytes(), &addr)
            }
            None => s.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = sent {
        warn!(
            "cannot notify the service manager ({}): {e}",
            path.to_string_lossy()
        );
    }
}

/// The daemon serves; `main_pid`: this process is the daemon now (a
/// successor that took the VMs over from the service's main process).
pub fn ready(main_pid: bool) {
    if main_pid {
        send(&format!("MAINPID={}\nREADY=1", std::process::id()));
    } else {
        send("READY=1");
    }
}

/// The daemon stops.
pub fn stopping() {
    send("STOPPING=1");
}
