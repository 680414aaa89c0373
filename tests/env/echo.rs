//! The backend Pod of the Tunnel tests on the node: the same answers as the in-process backends
//! of tests/common/kubelet.rs, so a test reads which Service port it reached.
//!
//!     echo <port>/<tcp|udp>...
//!
//! TCP: sends `<port>\n` on accept, then echoes until the peer closes its side.
//! UDP: answers each datagram with `<port>:<datagram>`.
//!
//! Standard library only, so `rustc` alone builds it static (tests/env/build-echo.sh).

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::thread;

fn main() {
    let mut servers = Vec::new();
    for arg in std::env::args().skip(1) {
        let Some((port, protocol)) = arg.split_once('/') else { fail(&format!("{arg}: want <port>/<tcp|udp>")) };
        let Ok(port) = port.parse::<u16>() else { fail(&format!("{arg}: not a port")) };
        servers.push(match protocol {
            "tcp" => {
                let listener = TcpListener::bind(("0.0.0.0", port)).unwrap_or_else(|e| fail(&format!("{arg}: {e}")));
                thread::spawn(move || tcp(listener, port))
            }
            "udp" => {
                let socket = UdpSocket::bind(("0.0.0.0", port)).unwrap_or_else(|e| fail(&format!("{arg}: {e}")));
                thread::spawn(move || udp(socket, port))
            }
            _ => fail(&format!("{arg}: the protocol is tcp or udp")),
        });
        println!("echo: {arg}");
    }
    if servers.is_empty() {
        fail("usage: echo <port>/<tcp|udp>...");
    }
    for server in servers {
        let _ = server.join();
    }
}

fn tcp(listener: TcpListener, port: u16) {
    for conn in listener.incoming().flatten() {
        thread::spawn(move || {
            let _ = answer(conn, port);
        });
    }
}

fn answer(mut conn: TcpStream, port: u16) -> std::io::Result<()> {
    conn.write_all(format!("{port}\n").as_bytes())?;
    let mut reader = conn.try_clone()?;
    std::io::copy(&mut reader, &mut conn)?;
    conn.shutdown(Shutdown::Write)
}

fn udp(socket: UdpSocket, port: u16) {
    let mut buf = vec![0u8; 65536];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let mut reply = format!("{port}:").into_bytes();
        reply.extend_from_slice(&buf[..n]);
        let _ = socket.send_to(&reply, from);
    }
}

fn fail(message: &str) -> ! {
    eprintln!("echo: {message}");
    std::process::exit(2)
}
