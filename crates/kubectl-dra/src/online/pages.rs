//! Lists read page by page (`limit` and `continue`), as kubectl reads them.
//!
//! One unpaged list of a 1,000-node fleet's ResourceSlices is ~77 MB of
//! JSON that the API server assembles and we hold twice (body, then typed
//! objects) before using any of it; in pages of [`PAGE_SIZE`] each page is
//! used and dropped before the next is asked for. A long list says how far
//! it got on stderr, when stderr is a terminal, so that a person waiting
//! knows it is working; in a pipe or a log it stays quiet.

use std::future::Future;
use std::io::IsTerminal as _;

use kube::api::ListParams;
use kube::core::ObjectList;

use super::OnlineError;

/// Objects per page: kubectl's `--chunk-size` default.
pub const PAGE_SIZE: u32 = 500;

/// The parameters of the page after `continue_token` (the first page: `None`).
pub fn page_params(base: &ListParams, continue_token: Option<&str>) -> ListParams {
    let params = base.clone().limit(PAGE_SIZE);
    match continue_token {
        Some(token) => params.continue_token(token),
        None => params,
    }
}

/// Where progress lines go.
type Sink = Box<dyn FnMut(&str)>;

/// Reports how many objects a list has read so far.
pub struct Progress {
    what: &'static str,
    /// Where the lines go; `None`: nowhere.
    sink: Option<Sink>,
    shown: bool,
}

impl Progress {
    /// On stderr when it is a terminal, else silent.
    pub fn on_stderr(what: &'static str) -> Progress {
        let sink: Option<Sink> = std::io::stderr()
            .is_terminal()
            .then(|| Box::new(|line: &str| eprint!("{line}")) as Sink);
        Progress {
            what,
            sink,
            shown: false,
        }
    }

    /// Into `sink` (tests).
    pub fn to(what: &'static str, sink: impl FnMut(&str) + 'static) -> Progress {
        Progress {
            what,
            sink: Some(Box::new(sink)),
            shown: false,
        }
    }

    pub fn silent(what: &'static str) -> Progress {
        Progress {
            what,
            sink: None,
            shown: false,
        }
    }

    /// After a page: a list that needs more than one page is long enough
    /// to say so; one that fits in one page never says anything.
    fn page(&mut self, listed: usize, more: bool) {
        if let Some(sink) = &mut self.sink
            && (more || self.shown)
        {
            // `\r` and erase-line: one line that counts up on the terminal.
            sink(&format!("\r\x1b[Klisted {listed} {}…", self.what));
            self.shown = true;
        }
    }

    /// The list is complete: the count line goes, the output follows clean.
    fn done(&mut self) {
        if let Some(sink) = &mut self.sink
            && self.shown
        {
            sink("\r\x1b[K");
        }
    }
}

/// Reads every page of a list: `fetch` asks for one page, `each` takes its
/// objects one by one. Returns how many there were.
pub async fn list_pages<K, F, Fut>(
    what: &'static str,
    base: &ListParams,
    mut fetch: F,
    mut each: impl FnMut(K),
    progress: &mut Progress,
) -> Result<usize, OnlineError>
where
    K: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<K>, kube::Error>>,
{
    let mut listed = 0;
    let mut token: Option<String> = None;
    loop {
        let page = match fetch(page_params(base, token.as_deref())).await {
            Ok(page) => page,
            Err(source) => {
                progress.done();
                return Err(OnlineError::List { what, source });
            }
        };
        listed += page.items.len();
        page.items.into_iter().for_each(&mut each);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        progress.page(listed, token.is_some());
        if token.is_none() {
            progress.done();
            return Ok(listed);
        }
    }
}
