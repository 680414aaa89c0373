//! A TCP forwarder that a test can cut and restore, to make a real endpoint unreachable for one
//! controller without stopping it for the other tests sharing it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    upstream: String,
    task: Mutex<Option<JoinHandle<()>>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts forwarding a free loopback port to `upstream` (host:port).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let proxy = Proxy { addr, upstream: upstream.to_string(), task: Mutex::new(None), conns: Arc::default() };
        proxy.serve(listener).await;
        proxy
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn serve(&self, listener: TcpListener) {
        let upstream = self.upstream.clone();
        let conns = self.conns.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let handle = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().await.push(handle);
            }
        });
        *self.task.lock().await = Some(task);
    }

    /// Closes the listener and every open connection: new connections are refused, as if the
    /// server had stopped.
    pub async fn cut(&self) {
        if let Some(t) = self.task.lock().await.take() {
            t.abort();
            let _ = t.await;
        }
        for c in self.conns.lock().await.drain(..) {
            c.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind proxy port");
        self.serve(listener).await;
    }
}
