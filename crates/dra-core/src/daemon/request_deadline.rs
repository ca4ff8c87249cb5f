//! A deadline on every API request that is not a watch.
//!
//! The HTTP client's own timeouts are per connection step (connect) or per
//! read (an idle socket), and the read timeout has to outlast a quiet watch,
//! which the server ends after its `timeoutSeconds` (290 s as kube sends
//! it). That leaves a GET, a slice write or a Node patch on a connection
//! that the server accepted and then never answered waiting for minutes:
//! publishing, health taints and prepare's claim GET stall behind it. This
//! layer gives each non-watch request one deadline (`--api-request-timeout`,
//! default [`DEFAULT_API_REQUEST_TIMEOUT`]) that covers the answer's head
//! and its whole body; a watch (`watch=true` in the query) is left to its
//! server-side timeout and kube's idle timeout on top of it.
//!
//! An expired deadline is an error of its own kind ([`RequestTimedOut`]),
//! which kube hands on as `kube::Error::Service`; every caller already
//! retries API errors with backoff.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::{Request, Response, Uri};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// Default `--api-request-timeout`: far above what a healthy API server
/// takes for the node's few objects (milliseconds), and below kubelet's
/// own deadline for a prepare call, so a prepare whose claim GET hangs
/// answers with an error kubelet retries instead of timing out itself.
pub(crate) const DEFAULT_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A non-watch API request got no complete answer within its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the API server did not answer within {limit:?} (the per-request deadline, \
     --api-request-timeout)"
)]
pub(crate) struct RequestTimedOut {
    /// The deadline the request had.
    pub limit: Duration,
}

/// Wraps a client's service in [`RequestDeadline`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestDeadlineLayer {
    limit: Duration,
}

impl RequestDeadlineLayer {
    /// Every non-watch request gets `limit`.
    pub(crate) fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for RequestDeadlineLayer {
    type Service = RequestDeadline<S>;

    fn layer(&self, inner: S) -> RequestDeadline<S> {
        RequestDeadline {
            inner,
            limit: self.limit,
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct RequestDeadline<S> {
    inner: S,
    limit: Duration,
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1`, as the API
/// server reads the parameter).
pub(crate) fn is_watch(uri: &Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RequestDeadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<ResBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let bounded = !is_watch(request.uri());
        let limit = self.limit;
        let deadline = Instant::now() + limit;
        let answer = self.inner.call(request);
        Box::pin(async move {
            if !bounded {
                let response = answer.await.map_err(Into::into)?;
                return Ok(response.map(|body| BoundedBody::new(body, None, limit)));
            }
            match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(response)) => {
                    Ok(response.map(|body| BoundedBody::new(body, Some(deadline), limit)))
                }
                Ok(Err(error)) => Err(error.into()),
                Err(_) => Err(Box::new(RequestTimedOut { limit }) as BoxError),
            }
        })
    }
}

/// A response body that fails with [`RequestTimedOut`] once its request's
/// deadline passes (none for a watch).
pub(crate) struct BoundedBody<B> {
    inner: B,
    deadline: Option<Pin<Box<Sleep>>>,
    limit: Duration,
}

impl<B> BoundedBody<B> {
    fn new(inner: B, deadline: Option<Instant>, limit: Duration) -> Self {
        Self {
            inner,
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            limit,
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let expired = match &mut this.deadline {
            Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if expired {
            return Poll::Ready(Some(Err(Box::new(RequestTimedOut { limit: this.limit }))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
