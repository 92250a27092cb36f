//! A TCP relay on loopback that a test can cut: clients given its address instead of the API server's reach
//! the API server through it, until [`Relay::cut`] closes every relayed connection and refuses new ones (what a
//! node sees when the network between it and the control plane fails), and [`Relay::restore`] lets them
//! through again. Runs on threads of its own, so that it outlives the runtime of the test that started it.

use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A running relay (it runs until the process exits).
#[derive(Debug, Clone)]
pub struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// Listens on a free loopback port and relays every connection to `target`.
    pub fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let relay = Self {
            addr: listener.local_addr()?,
            cut: Arc::new(AtomicBool::new(false)),
            open: Arc::new(Mutex::new(Vec::new())),
        };
        let me = relay.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if me.cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                me.pipe(client, server);
            }
        });
        Ok(relay)
    }

    fn pipe(&self, client: TcpStream, server: TcpStream) {
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        if let Ok(mut open) = self.open.lock() {
            open.retain(|s| s.peer_addr().is_ok());
            open.extend(client.try_clone().ok());
            open.extend(server.try_clone().ok());
        }
        for (mut from, mut to) in [(client, s2), (server, c2)] {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
            });
        }
    }

    /// The relay's address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every relayed connection and refuses new ones until [`Relay::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut open) = self.open.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}
