//! Flags, and listing page by page.

use super::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::core::ObjectList;

#[test]
fn request_timeouts_as_kubectl_reads_them() {
    let ok = [
        ("0", None),
        ("5", Some(Duration::from_secs(5))),
        ("500ms", Some(Duration::from_millis(500))),
        ("30s", Some(Duration::from_secs(30))),
        ("1m30s", Some(Duration::from_secs(90))),
        ("1.5h", Some(Duration::from_secs(5400))),
        ("0s", None),
    ];
    for (text, want) in ok {
        assert_eq!(parse_request_timeout(text), Ok(want), "{text}");
    }
    for bad in ["", "s", "5x", "-1", "1m30", "abc", "1e400h"] {
        let e = parse_request_timeout(bad).expect_err(bad);
        assert!(e.contains("invalid timeout"), "{bad}: {e}");
    }
}

fn page(names: &[&str], next: Option<&str>) -> ObjectList<ConfigMap> {
    ObjectList {
        types: Default::default(),
        metadata: ListMeta {
            continue_: next.map(str::to_string),
            ..Default::default()
        },
        items: names
            .iter()
            .map(|n| {
                let mut c = ConfigMap::default();
                c.metadata.name = Some(n.to_string());
                c
            })
            .collect(),
    }
}

#[tokio::test]
async fn lists_every_page_passing_the_continue_token() {
    let pages = [
        page(&["a", "b"], Some("tok-1")),
        page(&["c", "d"], Some("tok-2")),
        page(&["e"], None),
    ];
    let asked = std::cell::RefCell::new(Vec::new());
    let mut names = Vec::new();
    let lines = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = lines.clone();
    let base = ListParams::default().fields("spec.nodeName=n1");
    let n = list_pages(
        "ConfigMaps",
        &base,
        |p: ListParams| {
            let i = asked.borrow().len();
            asked.borrow_mut().push(p);
            let answer = pages[i].clone();
            async move { Ok(answer) }
        },
        |c: ConfigMap| names.push(c.metadata.name.unwrap_or_default()),
        &mut Progress::to("ConfigMaps", move |l| sink.borrow_mut().push(l.to_string())),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 5);
    assert_eq!(names, ["a", "b", "c", "d", "e"]);
    let asked = asked.into_inner();
    let tokens: Vec<Option<&str>> = asked.iter().map(|p| p.continue_token.as_deref()).collect();
    assert_eq!(tokens, [None, Some("tok-1"), Some("tok-2")]);
    for p in &asked {
        assert_eq!(p.limit, Some(PAGE_SIZE));
        assert_eq!(p.field_selector.as_deref(), Some("spec.nodeName=n1"));
    }
    // A count that grows on one line, cleared when the list is complete.
    assert_eq!(
        *lines.borrow(),
        [
            "\r\x1b[Klisted 2 ConfigMaps…",
            "\r\x1b[Klisted 4 ConfigMaps…",
            "\r\x1b[Klisted 5 ConfigMaps…",
            "\r\x1b[K"
        ]
    );
}

#[tokio::test]
async fn one_page_says_nothing_and_an_error_names_the_list() {
    let lines = std::rc::Rc::new(std::cell::RefCell::new(Vec::<String>::new()));
    let sink = lines.clone();
    let n = list_pages(
        "ConfigMaps",
        &ListParams::default(),
        |_| async { Ok(page(&["a"], Some(""))) },
        |_: ConfigMap| {},
        &mut Progress::to("ConfigMaps", move |l| sink.borrow_mut().push(l.to_string())),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 1);
    assert!(lines.borrow().is_empty(), "{:?}", lines.borrow());

    let gone = kube::Error::Api(Box::new(
        kube::core::Status::failure("continue token expired", "Expired").with_code(410),
    ));
    let mut answer = Some(gone);
    let e = list_pages(
        "ResourceSlices",
        &ListParams::default(),
        |_| {
            let a = answer.take();
            async move {
                Err::<ObjectList<ConfigMap>, _>(
                    a.unwrap_or(kube::Error::LinesCodecMaxLineLengthExceeded),
                )
            }
        },
        |_: ConfigMap| {},
        &mut Progress::silent("ResourceSlices"),
    )
    .await
    .expect_err("410");
    let text = e.to_string();
    assert!(text.contains("listing ResourceSlices"), "{text}");
    assert!(text.contains("run the command again"), "{text}");
}

/// The requests as they go on the wire carry `limit`, `continue` and the
/// field selector.
#[test]
fn page_requests_carry_limit_continue_and_field_selector() {
    let url = |p: &ListParams| {
        kube::core::Request::new("/apis/resource.k8s.io/v1/resourceslices")
            .list(p)
            .map(|r| r.uri().to_string())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let scope = SliceScope {
        node: Some("trn2-0001".to_string()),
        driver: None,
    };
    let selectors = scope.field_selectors();
    let base = ListParams::default().fields(selectors[0].as_deref().unwrap_or_default());
    let first = url(&page_params(&base, None));
    assert!(first.contains("limit=500"), "{first}");
    assert!(
        first.contains("fieldSelector=spec.nodeName%3Dtrn2-0001"),
        "{first}"
    );
    assert!(!first.contains("continue="), "{first}");
    let next = url(&page_params(&base, Some("abc")));
    assert!(next.contains("continue=abc"), "{next}");
    assert!(next.contains("limit=500"), "{next}");
}

#[test]
fn slice_scopes_as_field_selectors() {
    let scope = |node: Option<&str>, driver: Option<&str>| SliceScope {
        node: node.map(str::to_string),
        driver: driver.map(str::to_string),
    };
    assert_eq!(scope(None, None).field_selectors(), [None]);
    assert_eq!(
        scope(None, Some("neuron.aws.com")).field_selectors(),
        [Some("spec.driver=neuron.aws.com".to_string())]
    );
    // The node's slices and those of no single node (they may name it per device).
    assert_eq!(
        scope(Some("n1"), None).field_selectors(),
        [
            Some("spec.nodeName=n1".to_string()),
            Some("spec.nodeName=".to_string())
        ]
    );
    assert_eq!(
        scope(Some("n1"), Some("efa.networking.k8s.aws")).field_selectors(),
        [
            Some("spec.nodeName=n1,spec.driver=efa.networking.k8s.aws".to_string()),
            Some("spec.nodeName=,spec.driver=efa.networking.k8s.aws".to_string())
        ]
    );
}
