//! Where the server listens (control.md, "Transport").

use std::path::PathBuf;

/// Environment variable that overrides the default socket path.
pub const SOCKET_ENV: &str = "RINGFEED_SOCKET";

/// The default socket path: `$XDG_RUNTIME_DIR/ringfeed/ringfeed.sock`, else
/// `/tmp/ringfeed-$UID/ringfeed.sock`; `RINGFEED_SOCKET` overrides both.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("ringfeed").join("ringfeed.sock"),
        None => PathBuf::from(format!("/tmp/ringfeed-{}", rustix::process::getuid().as_raw())).join("ringfeed.sock"),
    }
}
