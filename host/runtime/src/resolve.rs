//! Name resolution for plugins' outbound requests. A grant names hosts; what
//! a name resolves to is whoever runs its DNS's choice. A granted name that
//! resolves to loopback, link-local (the cloud metadata service at
//! 169.254.169.254 among them), unspecified or multicast addresses would
//! reach the host itself or its cloud's credentials, so such addresses are
//! dropped and a name with nothing else is not connected to. An address
//! written in the grant itself (`http://127.0.0.1:8787`) is not resolved and
//! stays reachable, and so does `localhost`, which names loopback plainly.
//! The controller's own addresses (`POD_IP`, which `capstan install` sets
//! from the downward API) count as internal too: a granted name answered
//! with the pod's IP would reach its metrics and health ports.

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The resolver of the outbound connection pool: the system's (`R` is
/// another only in tests), its internal addresses dropped.
#[derive(Clone, Debug)]
pub(crate) struct GrantedNames<R = GaiResolver>(R);

impl GrantedNames {
    pub(crate) fn new() -> Self {
        GrantedNames(GaiResolver::new())
    }
}

type Resolving =
    Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, std::io::Error>> + Send>>;

impl<R> tower_service::Service<Name> for GrantedNames<R>
where
    R: tower_service::Service<Name, Error = std::io::Error>,
    R::Response: Iterator<Item = SocketAddr>,
    R::Future: Send + 'static,
{
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolving = self.0.call(name.clone());
        Box::pin(async move {
            let found: Vec<SocketAddr> = resolving.await?.collect();
            reachable(name.as_str(), found, own_addresses()).map(Vec::into_iter)
        })
    }
}

const REFUSED: &str = "resolves only to internal addresses";

/// The refusal [`GrantedNames`] made, if that is why `error` happened
/// (the gate reports it as a capability violation, not a network fault).
pub(crate) fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::PermissionDenied
            && io.to_string().contains(REFUSED)
        {
            return Some(io.to_string());
        }
        source = e.source();
    }
    None
}

/// This process's own addresses, from `POD_IP` (comma-separated; unset or
/// unparsable entries: none).
fn own_addresses() -> &'static [IpAddr] {
    static OWN: std::sync::OnceLock<Vec<IpAddr>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        std::env::var("POD_IP")
            .unwrap_or_default()
            .split(',')
            .filter_map(|a| a.trim().parse().ok())
            .collect()
    })
}

/// The addresses of `name` a plugin may connect to; `own`: this process's
/// addresses, refused like loopback.
pub(crate) fn reachable(
    name: &str,
    found: Vec<SocketAddr>,
    own: &[IpAddr],
) -> Result<Vec<SocketAddr>, std::io::Error> {
    if name.eq_ignore_ascii_case("localhost") {
        return Ok(found);
    }
    let (internal, public): (Vec<SocketAddr>, Vec<SocketAddr>) = found
        .into_iter()
        .partition(|a| internal(a.ip()) || own.contains(&a.ip()));
    if public.is_empty() && !internal.is_empty() {
        tracing::warn!(%name, addresses = ?internal, "outbound request refused: the name resolves only to loopback, link-local or other internal addresses");
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{name} {REFUSED} (loopback, link-local, the controller's own); grant the address itself to reach it"
            ),
        ));
    }
    Ok(public)
}

fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => internal(IpAddr::V4(v4)),
            None => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unicast_link_local()
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resolves every name to one address, as a hostile DNS answer would.
    #[derive(Clone)]
    struct Answer(SocketAddr);

    impl tower_service::Service<Name> for Answer {
        type Response = std::vec::IntoIter<SocketAddr>;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<Self::Response, std::io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Name) -> Self::Future {
            std::future::ready(Ok(vec![self.0].into_iter()))
        }
    }

    #[tokio::test]
    async fn a_name_answered_with_loopback_is_never_connected_to() {
        use http_body_util::Empty;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let connector = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(
            GrantedNames(Answer(at)),
        );
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, Empty<bytes::Bytes>>(connector);
        let by_name: http::Uri = format!("http://metadata.example.com:{}/", at.port())
            .parse()
            .unwrap();
        let error = client.get(by_name).await.unwrap_err();
        let reason = refusal(&error).expect("refused by the resolver");
        assert!(
            reason.contains("metadata.example.com resolves only to internal addresses"),
            "{reason}"
        );
        let accepted =
            tokio::time::timeout(std::time::Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "nothing connected");
        // The address itself, as a grant may name it, is reached (the
        // resolver is not asked for it).
        let by_address: http::Uri = format!("http://{at}/").parse().unwrap();
        let request = tokio::spawn(async move { client.get(by_address).await });
        let accepted =
            tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept()).await;
        assert!(matches!(accepted, Ok(Ok(_))), "connected by address");
        request.abort();
    }

    fn at(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 443)
    }

    #[test]
    fn internal_addresses_of_a_name_are_dropped() {
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
        ] {
            let e = reachable("ec2.example.com", vec![at(ip)], &[]).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{ip}");
            assert!(
                e.to_string()
                    .contains("resolves only to internal addresses"),
                "{e}"
            );
        }
        let mixed = reachable(
            "ec2.example.com",
            vec![at("169.254.169.254"), at("203.0.113.7")],
            &[],
        )
        .unwrap();
        assert_eq!(mixed, vec![at("203.0.113.7")]);
        // Private ranges are a cloud's ordinary endpoints (VPC endpoints).
        assert_eq!(
            reachable("vpce.example.com", vec![at("10.0.0.5")], &[])
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            reachable("localhost", vec![at("127.0.0.1")], &[])
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn the_controllers_own_address_is_internal() {
        let own: [IpAddr; 1] = ["10.244.1.7".parse().unwrap()];
        let e = reachable("api.example.com", vec![at("10.244.1.7")], &own).unwrap_err();
        assert!(e.to_string().contains("the controller's own"), "{e}");
        // Its neighbours are ordinary private endpoints.
        let next = reachable("api.example.com", vec![at("10.244.1.8")], &own).unwrap();
        assert_eq!(next, vec![at("10.244.1.8")]);
    }
}
