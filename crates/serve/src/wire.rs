//! The socket's frames on a connection: reading client messages, writing server messages, and
//! the ring's file descriptor sent with the `ring` answer (control.md, "Framing").

use std::io::IoSlice;
use std::mem::MaybeUninit;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use ringfeed_format::control::frame::check_length;
use ringfeed_format::control::{ClientMessage, ErrorCode, ServerMessage, decode_frame, encode_frame};

/// Why a connection ends before the client closes it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionEnd {
    /// A fatal error, sent to the client as an `error` message.
    #[error("{message}")]
    Failed { code: ErrorCode, message: String },
    /// Writing to the client failed: it has gone.
    #[error("writing to the client: {0}")]
    Write(#[from] std::io::Error),
}

/// A message handled, or the reason the connection must end.
pub(crate) type Reply = Result<(), ConnectionEnd>;

/// Sends a fatal error and ends the connection.
pub(crate) async fn fail(write: &mut OwnedWriteHalf, code: ErrorCode, message: String) -> Reply {
    let _ = send(write, &ServerMessage::error(code, message.clone(), true)).await;
    Err(ConnectionEnd::Failed { code, message })
}

pub(crate) async fn send(write: &mut OwnedWriteHalf, msg: &ServerMessage) -> Reply {
    write.write_all(&encode_frame(msg)).await.map_err(ConnectionEnd::Write)
}

/// Sends `msg` with `fd` attached to its first byte (control.md, "Framing").
pub(crate) async fn send_with_fd(
    write: &mut OwnedWriteHalf,
    msg: &ServerMessage,
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let frame = encode_frame(msg);
    let stream: &UnixStream = write.as_ref();
    let sent = loop {
        stream.writable().await?;
        let attempt = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut ancillary = SendAncillaryBuffer::new(&mut space);
            let fds = [fd];
            ancillary.push(SendAncillaryMessage::ScmRights(&fds));
            sendmsg(stream, &[IoSlice::new(&frame)], &mut ancillary, SendFlags::NOSIGNAL).map_err(std::io::Error::from)
        });
        match attempt {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    write.write_all(&frame[sent..]).await
}

/// Reads frames until EOF or a protocol error, forwarding decoded messages.
pub(crate) async fn read_messages(
    mut read: OwnedReadHalf,
    tx: mpsc::Sender<Result<ClientMessage, (ErrorCode, String)>>,
) {
    loop {
        let mut prefix = [0u8; 4];
        if read.read_exact(&mut prefix).await.is_err() {
            return; // EOF or a broken socket: the client is gone.
        }
        let len = match check_length(prefix) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.send(Err((ErrorCode::Protocol, e.to_string()))).await;
                return;
            }
        };
        let mut payload = vec![0u8; len];
        if read.read_exact(&mut payload).await.is_err() {
            return;
        }
        let parsed = decode_frame(&payload)
            .map_err(|e| (ErrorCode::Protocol, e.to_string()))
            .and_then(|(kind, value)| {
                serde_json::from_value::<ClientMessage>(value).map_err(|e| {
                    let code = if kind == "open" {
                        ErrorCode::BadRequest
                    } else {
                        ErrorCode::Protocol
                    };
                    (code, format!("invalid `{kind}` message: {e}"))
                })
            });
        let stop = parsed.is_err();
        if tx.send(parsed).await.is_err() || stop {
            return;
        }
    }
}
