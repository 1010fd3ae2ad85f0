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
    /// The model id clients send and see (default: the weight file's name
    /// without `.gguf`, the checkpoint directory's name, or the hub id).
    #[arg(long)]
    pub served_model_name: Option<String>,
}

/// Binds first (a taken port fails before the model loads), then answers
/// until killed.
pub fn run(a: ServeArgs) -> Result<()> {
    let listener = Listener::bind(&a.host, a.port)?
        .max_connections(a.max_connections)
        .served_model_name(a.served_model_name.clone());
    let shared = SharedBackend::spawn(a.model.load()?)?;
    let model = shared.model_id().clone();
    let name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| model.short_name());
    let server = listener.serve(shared.client(), model)?;
    let addr = server.addr();
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {addr}, beyond this machine; the server has no authentication"
        );
    }
    eprintln!(
        "statebench serve: {name} on http://{addr} ({})",
        statebench::http_server::ROUTES
    );
    server.wait();
    Ok(())
}
