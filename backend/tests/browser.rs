//! End-to-end tests in real headless Chromium (Debian's `chromium` and
//! `chromium-driver`), driven over WebDriver.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use wallet_testkit::*;

/// A chromedriver process and a browser session on it; both end on drop.
struct Browser {
    client: Client,
    driver: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    /// Ends the WebDriver session, which quits Chromium.
    async fn quit(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// Chromium is chromedriver's child: end the whole process group, or
    /// browsers would outlive the test.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
        // A test that failed before `quit` leaves its browser behind: its
        // profile directory names it.
        let _ = Command::new("pkill")
            .arg("-KILL")
            .arg("-f")
            .arg(self.profile.as_os_str())
            .status();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

async fn browser() -> Browser {
    assert!(
        std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists(),
        "Chromium is not installed: apt-get install chromium chromium-driver (./scripts/test does this)"
    );
    let port = closed_port();
    let driver = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let profile = std::env::temp_dir().join(format!("lw-chromium-{}", uuid::Uuid::new_v4().simple()));
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1200,1400",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    let url = format!("http://127.0.0.1:{port}");
    let mut last_error = None;
    for _ in 0..50 {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => {
                return Browser {
                    client,
                    driver,
                    profile,
                };
            }
            Err(error) => last_error = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not start a Chromium session: {last_error:?}");
}

async fn fill(client: &Client, css: &str, text: &str) {
    let field = client.find(Locator::Css(css)).await.expect(css);
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
}

/// Waits for the element (a click often follows a navigation that has not
/// finished loading), then clicks it.
async fn click(client: &Client, css: &str) {
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .expect(css)
        .click()
        .await
        .expect("click");
}

/// How far the page scrolls sideways, in CSS pixels: 0 when it fits.
async fn sideways_scroll_px(client: &Client) -> Value {
    client
        .execute(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await
        .expect("widths")
}

async fn text_of(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .expect(css)
        .text()
        .await
        .expect("text")
}

/// Signs up through the browser's form and lands on the wallet page.
async fn sign_up_in_browser(app: &TestApp, client: &Client, name: &str) {
    client.goto(&app.url("/signup")).await.expect("open sign-up");
    fill(client, "#name", name).await;
    fill(client, "#password", "correct horse battery").await;
    click(client, "#submit").await;
    let balance = text_of(client, "#balance").await;
    assert_eq!(balance, "$1,000.00");
}

async fn user_id(app: &TestApp, name: &str) -> uuid::Uuid {
    sqlx::query_scalar("SELECT id FROM users WHERE name = $1")
        .bind(name)
        .fetch_one(&app.db)
        .await
        .expect("user")
}

/// Sign up, send money, then double-click the submit button: exactly one
/// transfer in the database, and a resubmitted form shows the original.
#[tokio::test]
async fn sign_up_transfer_and_a_double_click_pays_once() {
    let app = spawn_app(|_| {}).await;
    app.sign_up("bob").await;
    let browser = browser().await;
    let client = &browser.client;
    sign_up_in_browser(&app, client, "alice").await;

    fill(client, "#recipient", "bob").await;
    fill(client, "#amount", "12.50").await;
    click(client, "#review").await;
    let heading = text_of(client, "#review-heading").await;
    assert_eq!(heading, "Send $12.50 to bob?");
    // Two clicks as fast as WebDriver sends them: the browser submits the
    // confirmation twice with the same hidden idempotency key.
    client
        .execute(
            "const b = document.getElementById('send'); b.click(); b.click(); return true;",
            vec![],
        )
        .await
        .expect("double click");
    let notice = text_of(client, "#notice").await;
    assert!(
        notice.contains("Sent $12.50 to bob") || notice.contains("Already processed"),
        "unexpected notice: {notice}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alice = app.wallet_of("alice").await;
    assert_eq!(app.transfer_count().await, 1, "a double click paid twice");
    assert_eq!(app.balance(alice).await, 100_000 - 1_250);
    assert_eq!(text_of(client, "#balance").await, "$987.50");

    // The history lists it, formatted.
    let history = text_of(client, "table.history").await;
    assert!(
        history.contains("Sent to bob") && history.contains("-$12.50"),
        "{history}"
    );

    // A second, different transfer inside the cooldown window: the page
    // says why, keeps the confirmation, and counts down until Send works.
    fill(client, "#recipient", "bob").await;
    fill(client, "#amount", "5").await;
    click(client, "#review").await;
    click(client, "#send").await;
    let notice = text_of(client, "#notice").await;
    assert!(
        notice.contains("You sent a transfer") && notice.contains("Try again in"),
        "{notice}"
    );
    let send = client.find(Locator::Css("#send")).await.expect("send button");
    assert!(
        send.attr("disabled").await.expect("attr").is_some(),
        "Send works inside the window"
    );
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#send:not([disabled])"))
        .await
        .expect("Send works again after the window");
    click(client, "#send").await;
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath(
            "//p[@id='notice' and contains(., 'Sent $5.00 to bob')]",
        ))
        .await
        .expect("the transfer went through once the window had passed");
    assert_eq!(app.balance(alice).await, 100_000 - 1_250 - 500);
    assert_eq!(app.transfer_count().await, 2);
    app.assert_invariants().await;
    browser.quit().await;
}

/// The race lab in Chromium: each preset with its layers on, then each
/// layer switched off. What the page says (its verdict and the money it
/// reports) is checked against the lab wallets in the database; focus
/// lands on the result; at a phone's width nothing scrolls sideways. Saves
/// a screenshot of each result for the README (`scripts/screenshots`).
#[tokio::test]
async fn the_race_lab_shows_each_layer_catch_what_it_catches() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1_000).await;
    let browser = browser().await;
    let client = &browser.client;
    sign_up_in_browser(&app, client, "alice").await;
    let alice = user_id(&app, "alice").await;
    let directory = std::env::var("SCREENSHOT_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/screenshots").to_owned());
    std::fs::create_dir_all(&directory).expect("screenshot directory");

    // (preset, switches to tick, whether the layers protect, name). With
    // the protecting layers weakened, the verdict is the damage, as
    // expected and counted.
    let runs = [
        ("same-key", &[][..], true, "race-lab-same-key"),
        ("retry-after-window", &[][..], true, "race-lab-retry"),
        ("overdraw", &[][..], true, "race-lab-overdraw"),
        ("crossing", &[][..], true, "race-lab-crossing"),
        ("double-click", &[][..], true, "race-lab-double-click"),
        (
            "same-key",
            &[
                "#switch-cooldown option[value=off]",
                "#switch-idempotency option[value=check_then_insert]",
            ][..],
            false,
            "race-lab-naive-key",
        ),
        (
            "overdraw",
            &["#switch-row-guard option[value=read_decide_write]"][..],
            false,
            "race-lab-naive-guard",
        ),
    ];
    for (preset, switches, protected, name) in runs {
        client.goto(&app.url("/race-lab")).await.expect("open race lab");
        click(client, &format!("input[name=preset][value={preset}]")).await;
        fill(client, "#count", "30").await;
        for switch in switches {
            click(client, switch).await;
        }
        click(client, "#fire").await;
        let summary = text_of(client, "#summary").await;
        let expected = if protected {
            "✓ It showed what it should."
        } else {
            "✓ As expected with"
        };
        assert!(summary.starts_with(expected), "{preset} {switches:?}: {summary}");
        let focused = client
            .execute(
                "return document.activeElement && document.activeElement.id;",
                vec![],
            )
            .await
            .expect("focus");
        assert_eq!(focused, json!("summary"), "focus moves to the result");

        let (moved, transfers): (i64, i64) =
            sqlx::query_as("SELECT moved_minor, transfers FROM race_lab_state($1)")
                .bind(alice)
                .fetch_one(&app.db)
                .await
                .expect("lab state");
        let marks = client.find_all(Locator::Css("svg .mark")).await.expect("marks");
        assert_eq!(marks.len(), 30, "one mark per request on the timeline");
        let shown = text_of(client, "#moved").await;
        assert_eq!(
            shown,
            layered_wallet::web::money::format(moved, "LAB"),
            "{preset}"
        );
        if preset == "same-key" && protected {
            assert_eq!(transfers, 1);
        }
        if !protected && preset == "same-key" {
            assert!(transfers > 1, "the naive key let copies through");
            assert!(
                summary.contains(&format!("One key was charged {transfers} times")),
                "the double charge is named: {summary}"
            );
        }
        let png = client.screenshot().await.expect("screenshot");
        std::fs::write(format!("{directory}/{name}.png"), png).expect("write screenshot");
    }

    // A phone's width: the result fits without sideways scrolling.
    client.set_window_size(390, 900).await.expect("narrow window");
    let overflow = sideways_scroll_px(client).await;
    assert_eq!(overflow, json!(0), "the page scrolls sideways at 390 px");

    // The live feed, with the runs' decisions in it, fits the phone too.
    client.goto(&app.url("/feed")).await.expect("open the feed");
    client
        .wait()
        .for_element(Locator::Css("#feed tbody tr"))
        .await
        .expect("the feed shows the runs' decisions");
    let overflow = sideways_scroll_px(client).await;
    assert_eq!(overflow, json!(0), "the feed scrolls sideways at 390 px");

    // Real money is untouched.
    assert_eq!(app.balance(app.wallet_of("alice").await).await, 100_000);
    app.assert_invariants().await;
    browser.quit().await;
}

/// A form posted without its CSRF token is refused and changes nothing,
/// before sign-in and after.
#[tokio::test]
async fn a_form_without_its_csrf_token_is_refused() {
    let app = spawn_app(|_| {}).await;
    app.sign_up("bob").await;
    let browser = browser().await;
    let client = &browser.client;

    client.goto(&app.url("/signup")).await.expect("open sign-up");
    client
        .execute(
            "document.querySelector('input[name=csrf]').remove(); return true;",
            vec![],
        )
        .await
        .expect("js");
    fill(client, "#name", "mallory").await;
    fill(client, "#password", "correct horse battery").await;
    click(client, "#submit").await;
    let error = text_of(client, "p.notice").await;
    assert!(error.contains("expired"), "{error}");
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE name = 'mallory'")
            .await,
        0
    );

    sign_up_in_browser(&app, client, "alice").await;
    fill(client, "#recipient", "bob").await;
    fill(client, "#amount", "1.00").await;
    client
        .execute(
            "document.querySelector('#transfer-form input[name=csrf]').value = 'forged'; return true;",
            vec![],
        )
        .await
        .expect("js");
    click(client, "#review").await;
    // Wait for the refusal page itself, not the wallet page it replaces.
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath("//h1[text()='Form expired']"))
        .await
        .expect("the refusal page");
    assert_eq!(app.transfer_count().await, 0);
    browser.quit().await;
}
