//! A client that acts as someone else: every request it sends carries
//! `Impersonate-User`, so the API server's RBAC for that user (not
//! Capstan's own) decides it. Used to apply a tenant's Addon as a
//! ServiceAccount of the tenant's namespace.
//!
//! The impersonating client sends through the client it was made from, so
//! it shares that client's connections, rate limit and leader fence.

use http::{HeaderValue, Request, Response};
use kube::Client;
use kube::client::Body;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The user name the API server gives a ServiceAccount.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// A client that sends every request through `base` as `user`. For a
/// ServiceAccount user name the API server adds the ServiceAccount's groups
/// itself (`system:serviceaccounts`, `system:serviceaccounts:NAMESPACE`);
/// `base`'s identity needs `impersonate` on that ServiceAccount.
pub fn impersonating(base: &Client, user: &str) -> Result<Client, crate::Error> {
    let header = HeaderValue::from_str(user).map_err(|_| {
        crate::Error::Identity(format!(
            "{user:?} is not a user name a request header can carry"
        ))
    })?;
    let sender = Impersonating {
        base: base.clone(),
        header,
    };
    Ok(Client::new(sender, base.default_namespace()))
}

#[derive(Clone)]
struct Impersonating {
    base: Client,
    header: HeaderValue,
}

impl tower::Service<Request<Body>> for Impersonating {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let headers = request.headers_mut();
        // Never more than one identity: a caller's own impersonation
        // headers are replaced, not added to.
        headers.remove("Impersonate-Group");
        headers.remove("Impersonate-Uid");
        headers.insert("Impersonate-User", self.header.clone());
        let base = self.base.clone();
        Box::pin(async move { base.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn every_request_carries_the_one_identity() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let headers = request.headers().clone();
            record.lock().unwrap().push(headers);
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(200)
                        .body(Body::from(br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}"#.to_vec()))
                        .unwrap(),
                )
            }
        });
        let base = Client::new(service, "default");
        let tenant = impersonating(&base, &service_account_user("team-a", "deployer")).unwrap();
        let mut request = Request::get("/api/v1/namespaces/team-a/configmaps/x")
            .header("Impersonate-Group", "system:masters")
            .body(Body::empty())
            .unwrap();
        request
            .headers_mut()
            .insert("Impersonate-User", HeaderValue::from_static("admin"));
        tenant.send(request).await.unwrap();
        let seen = seen.lock().unwrap();
        let headers = &seen[0];
        let users: Vec<_> = headers.get_all("Impersonate-User").iter().collect();
        assert_eq!(users, ["system:serviceaccount:team-a:deployer"]);
        assert!(headers.get("Impersonate-Group").is_none());
        assert!(impersonating(&base, "bad\nname").is_err());
    }
}
