//! `statebench serve`.

use anyhow::Result;
use clap::Args;

use statebench::backend::shared::SharedBackend;
use statebench::http_server::Listener;

use super::ModelArgs;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on. Anything but loopback exposes the engine, unauthenticated, to the network.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Connections served at once; more are answered 503 at once.
    #[arg(long, default_value_t = statebench::http_server::MAX_CONNECTIONS)]
    pub max_connections: usize,
}

/// Binds first (a taken port fails before the model loads), then answers
/// until killed.
pub fn run(a: ServeArgs) -> Result<()> {
    let listener = Listener::bind(&a.host, a.port)?.max_connections(a.max_connections);
    let shared = SharedBackend::spawn(a.model.load()?)?;
    let model = shared.model_id().clone();
    let server = listener.serve(shared.client(), model.clone())?;
    let addr = server.addr();
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {addr}, beyond this machine; the server has no authentication"
        );
    }
    eprintln!(
        "statebench serve: {} on http://{addr} (POST /v1/chat/completions, GET /v1/models)",
        model.name
    );
    server.wait();
    Ok(())
}
