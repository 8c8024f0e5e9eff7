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
                "--no-first-run", "--window-size=1280,1400",
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

/// Where the text of the elements matching `css` wraps inside a word: each
/// line break not after a space or a hyphen, as the characters either side
/// of it. Empty when every id and name wraps at a sensible point.
async fn breaks_mid_word(client: &Client, css: &str) -> Vec<String> {
    let found = client
        .execute(
            r#"const breaks = [];
            for (const element of document.querySelectorAll(arguments[0])) {
              const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
              let top = null, before = " ", node;
              while ((node = walker.nextNode())) {
                for (let i = 0; i < node.data.length; i += 1) {
                  const range = document.createRange();
                  range.setStart(node, i);
                  range.setEnd(node, i + 1);
                  const box = range.getClientRects()[0];
                  if (!box || /\s/.test(node.data[i])) { before = node.data[i]; continue; }
                  if (top !== null && box.top > top + 2 && !/[\s-]/.test(before)) {
                    breaks.push(before + "|" + node.data[i] + " in " + element.textContent.trim());
                  }
                  top = box.top;
                  before = node.data[i];
                }
              }
            }
            return breaks;"#,
            vec![json!(css)],
        )
        .await
        .expect("line breaks");
    serde_json::from_value(found).expect("strings")
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

/// The timeline's visible tick labels sit on one line, each right of the
/// one before.
async fn assert_axis_reads_left_to_right(client: &Client, what: &str) {
    let labels = client
        .execute(
            "return Array.from(document.querySelectorAll('figure.timeline .axis span'))
               .filter((span) => getComputedStyle(span).visibility !== 'hidden')
               .map((span) => { const box = span.getBoundingClientRect(); return [box.top, box.left]; });",
            vec![],
        )
        .await
        .expect("axis labels");
    let boxes: Vec<(f64, f64)> = serde_json::from_value(labels).expect("boxes");
    assert!(boxes.len() >= 3, "{what}: {boxes:?}");
    assert!(
        boxes
            .windows(2)
            .all(|pair| pair[0].0 == pair[1].0 && pair[0].1 < pair[1].1),
        "{what}: the axis labels are not on one line, left to right: {boxes:?}"
    );
}

/// One run of the lab through its form: its preset and switches (cooldown,
/// key claim, balance guard), the keys its requests carry, and the name of
/// its screenshot when the documentation shows it.
#[derive(Debug)]
struct LabRun {
    switches: (&'static str, &'static str, &'static str, &'static str),
    keys: &'static str,
    picture: Option<&'static str>,
}

/// The presets whose requests all stand for one transfer (or one event):
/// any transfer beyond the first is a duplicate charge.
const ONCE_ONLY: [&str; 5] = [
    "same-key",
    "double-click",
    "retry-after-window",
    "webhook-storm",
    "redelivery",
];

/// Every preset with every switch the lab offers for it: each layer on,
/// off and naive in every combination; each alternative way to claim a key
/// or guard the balance; and each key strategy a client may use.
fn every_switch() -> Vec<LabRun> {
    const PRESETS: [&str; 7] = [
        "same-key",
        "double-click",
        "retry-after-window",
        "overdraw",
        "crossing",
        "webhook-storm",
        "redelivery",
    ];
    let default_keys = |preset: &str| match preset {
        "double-click" => "none",
        "overdraw" | "crossing" => "new",
        _ => "same",
    };
    let picture = |switches| match switches {
        ("same-key", "on", "atomic", "guarded") => Some("race-lab-same-key"),
        ("retry-after-window", "on", "atomic", "guarded") => Some("race-lab-retry"),
        ("overdraw", "off", "atomic", "guarded") => Some("race-lab-overdraw"),
        ("overdraw", "off", "atomic", "read_decide_write") => Some("race-lab-naive-guard"),
        ("webhook-storm", "off", "check_then_insert", "guarded") => Some("race-lab-naive-inbox"),
        _ => None,
    };
    let mut runs = Vec::new();
    for preset in PRESETS {
        let keys = default_keys(preset);
        for cooldown in ["on", "off"] {
            for key in ["atomic", "check_then_insert"] {
                for guard in ["guarded", "read_decide_write"] {
                    let switches = (preset, cooldown, key, guard);
                    runs.push(LabRun {
                        switches,
                        keys,
                        picture: picture(switches),
                    });
                }
            }
        }
        for (key, guard) in [
            ("advisory_lock", "guarded"),
            ("redis_key_lock", "guarded"),
            ("atomic", "for_update"),
            ("atomic", "optimistic_version"),
        ] {
            runs.push(LabRun {
                switches: (preset, "off", key, guard),
                keys,
                picture: None,
            });
        }
        // Deliveries carry their event's id whatever the keys field says.
        if !preset.starts_with("webhook") && preset != "redelivery" {
            for other in ["same", "new", "none"].into_iter().filter(|other| *other != keys) {
                runs.push(LabRun {
                    switches: (preset, "off", "atomic", "guarded"),
                    keys: other,
                    picture: None,
                });
            }
        }
    }
    runs
}

/// Each harm to money the database shows after a run of `preset`, in lab
/// minor units, by the rule the page promises: the overcharge of a
/// duplicate, each wallet's overdraft by its ledger, money created or
/// destroyed, each balance's distance from its ledger, and what the bank
/// sent twice or without a debit. Sorted.
async fn harms_in_the_database(app: &TestApp, user: uuid::Uuid, preset: &str) -> Vec<i64> {
    let (moved, transfers, created, sent_twice, without_a_debit): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT moved_minor, transfers, money_created_minor, sent_twice_minor, sent_without_a_debit_minor
           FROM race_lab_state($1)",
    )
    .bind(user)
    .fetch_one(&app.db)
    .await
    .expect("lab state");
    let wallets: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT w.balance_minor,
                (w.opening_balance_minor
                 + coalesce((SELECT sum(l.amount_minor) FROM ledger_entries l WHERE l.wallet_id = w.id), 0))::bigint
           FROM wallets w WHERE w.user_id = $1 AND w.lab_slot IN (1, 2) ORDER BY w.lab_slot",
    )
    .bind(user)
    .fetch_all(&app.db)
    .await
    .expect("lab wallets");
    let mut harms = Vec::new();
    if ONCE_ONLY.contains(&preset) && transfers > 1 {
        harms.push(moved - moved / transfers);
    }
    harms.extend(
        wallets
            .iter()
            .filter(|(_, ledger)| *ledger < 0)
            .map(|(_, ledger)| -ledger),
    );
    harms.extend(
        [created.abs(), sent_twice, without_a_debit]
            .into_iter()
            .filter(|minor| *minor > 0),
    );
    harms.extend(
        wallets
            .iter()
            .filter(|(balance, ledger)| balance != ledger)
            .map(|(balance, ledger)| (balance - ledger).abs()),
    );
    harms.sort_unstable();
    harms
}

/// The page's rules for a run whose harms the database counts as `harms`:
/// the headline is red with ✗ exactly when there is harm, green with ✓
/// otherwise; every amount of harm on the page is the database's; no ✗
/// precedes a sentence stating a good outcome; and no figure exceeds its
/// whole.
async fn assert_the_page_tells_the_harm(client: &Client, run: &str, harms: &[i64], count: i64) {
    let page: Value = client
        .execute(
            "const summary = document.getElementById('summary');
             const counts = (css) => Array.from(document.querySelectorAll(css)).map((e) => parseInt(e.textContent, 10));
             return {
               class: summary.className, text: summary.textContent.trim(), color: getComputedStyle(summary).color,
               harms: Array.from(document.querySelectorAll('#money li.harm')).map((li) => [Number(li.dataset.harmMinor), li.textContent]),
               crossed: document.body.innerText.split('✗').slice(1).map((after) => after.trim()),
               overlap: parseInt(document.getElementById('overlap').textContent, 10),
               whole: parseInt(document.getElementById('overlap-whole').textContent, 10),
               stages: Array.from(document.querySelectorAll('#funnel li'))
                 .map((li) => [li.querySelector('.funnel-label').textContent, parseInt(li.querySelector('strong').textContent, 10)]),
               lanes: counts('.lane-label strong'),
             };",
            vec![],
        )
        .await
        .expect("the page's figures");
    let harmed = !harms.is_empty();
    let text = page["text"].as_str().expect("headline");
    assert_eq!(
        page["class"].as_str().expect("class").ends_with(" harmed"),
        harmed,
        "{run}: {text}"
    );
    assert_eq!(text.starts_with('✗'), harmed, "{run}: {text}");
    assert_eq!(text.starts_with('✓'), !harmed, "{run}: {text}");
    let red = page["color"] == json!("rgb(164, 14, 38)");
    let green = page["color"] == json!("rgb(17, 99, 41)");
    assert!(
        if harmed { red } else { green },
        "{run}: headline colour {} for {harms:?}",
        page["color"]
    );
    let shown: Vec<(i64, String)> = serde_json::from_value(page["harms"].clone()).expect("harms");
    let mut amounts: Vec<i64> = shown.iter().map(|(minor, _)| *minor).collect();
    amounts.sort_unstable();
    assert_eq!(
        amounts, harms,
        "{run}: the page's harms are not the database's: {shown:?}"
    );
    for (minor, said) in &shown {
        let amount = layered_wallet::web::money::format(*minor, "LAB");
        assert!(
            said.contains(&amount) && text.contains(&amount),
            "{run}: {amount} in {said} / {text}"
        );
    }
    let crossed: Vec<String> = serde_json::from_value(page["crossed"].clone()).expect("crosses");
    for after in &crossed {
        let good = ["No ", "Each ", "Every ", "None", "Nothing", "The money is"]
            .iter()
            .any(|start| after.starts_with(start));
        assert!(!good, "{run}: a ✗ before a good outcome: ✗ {after}");
    }
    let (overlap, whole) = (
        page["overlap"].as_i64().expect("overlap"),
        page["whole"].as_i64().expect("whole"),
    );
    assert!(
        overlap <= whole && whole <= count,
        "{run}: at most {overlap} of the {whole}, of {count}"
    );
    let stages: Vec<(String, i64)> = serde_json::from_value(page["stages"].clone()).expect("stages");
    let (sent, bank) = (
        stages[0].1,
        ["Sent by the outbox", "Answered by the bank", "Settled"],
    );
    assert_eq!(sent, count, "{run}");
    let stopped: Vec<i64> = stages[1..]
        .iter()
        .filter(|(label, _)| !bank.iter().any(|b| label.starts_with(b)))
        .map(|(_, n)| *n)
        .collect();
    assert!(stopped.iter().all(|n| *n <= sent), "{run}: {stages:?}");
    assert_eq!(
        stopped.iter().sum::<i64>(),
        sent,
        "{run}: the funnel does not add up: {stages:?}"
    );
    let lanes: Vec<i64> = serde_json::from_value(page["lanes"].clone()).expect("lanes");
    assert_eq!(
        lanes.iter().sum::<i64>(),
        sent,
        "{run}: the timeline does not add up: {lanes:?}"
    );
}

/// The run's page offers to fire the same run again: its "Fire again" form
/// holds the run's preset, count, keys and every switch.
async fn assert_fire_again_repeats(client: &Client, run: &LabRun, count: i64) {
    let form = client
        .execute(
            "const value = (id) => document.getElementById(id).value;
             return [document.querySelector('input[name=preset]:checked').value, value('count'), value('keys'),
                     value('switch-cooldown'), value('switch-idempotency'), value('switch-row-guard')];",
            vec![],
        )
        .await
        .expect("the fire-again form");
    let (preset, cooldown, key, guard) = run.switches;
    assert_eq!(
        form,
        json!([preset, count.to_string(), run.keys, cooldown, key, guard]),
        "{run:?}: fire again does not repeat the run"
    );
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

    // On a phone, the wallet id and the history wrap between words or
    // after a hyphen, never inside a word.
    client.set_window_size(390, 900).await.expect("narrow window");
    client.goto(&app.url("/wallet")).await.expect("the wallet");
    let mid_word = breaks_mid_word(client, "#wallet-id, table.history td").await;
    assert!(mid_word.is_empty(), "{mid_word:?}");

    // The live feed names the recipient, and with one instance answering
    // it leaves the instance out.
    client.goto(&app.url("/feed")).await.expect("open the feed");
    client
        .wait()
        .for_element(Locator::Css("#feed tbody tr"))
        .await
        .expect("the feed shows the transfers");
    let rows: Vec<String> = serde_json::from_value(
        client
            .execute(
                "return Array.from(document.querySelectorAll('#feed tbody tr')).map((tr) => tr.innerText);",
                vec![],
            )
            .await
            .expect("rows"),
    )
    .expect("texts");
    assert!(rows.iter().any(|row| row.contains("12.50 to bob")), "{rows:?}");
    assert!(
        rows.iter()
            .all(|row| !row.contains("instance") && !row.contains(" on ")),
        "{rows:?}"
    );
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
    let app = spawn_app(|settings| {
        settings.cooldown_ttl_ms = 1_000;
        // Every preset with every switch: 56 runs by one visitor.
        settings.race_lab_run_spacing_ms = 0;
        settings.race_lab_runs_per_user_per_minute_max = 1_000;
        // Every run's results kept, so that the pictured ones can be
        // reopened at a phone's width.
        settings.race_lab_results_per_user_max = 200;
        // The lab bank's lost answers are asked again at once.
        settings.payout_retry_base_ms = 10;
        settings.payout_retry_cap_ms = 20;
    })
    .await;
    let browser = browser().await;
    let client = &browser.client;
    sign_up_in_browser(&app, client, "alice").await;
    let alice = user_id(&app, "alice").await;
    let directory = std::env::var("SCREENSHOT_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/screenshots").to_owned());
    std::fs::create_dir_all(&directory).expect("screenshot directory");

    let mut addresses = Vec::new();
    const COUNT: i64 = 12;
    for run in every_switch() {
        let (preset, cooldown, key, guard) = run.switches;
        client.goto(&app.url("/race-lab")).await.expect("open race lab");
        click(client, &format!("input[name=preset][value={preset}]")).await;
        fill(client, "#count", &COUNT.to_string()).await;
        click(client, &format!("#keys option[value={}]", run.keys)).await;
        click(client, &format!("#switch-cooldown option[value={cooldown}]")).await;
        click(client, &format!("#switch-idempotency option[value={key}]")).await;
        click(client, &format!("#switch-row-guard option[value={guard}]")).await;
        click(client, "#fire").await;
        let summary = text_of(client, "#summary").await;
        let address = client.current_url().await.expect("url");
        assert!(
            address.path().starts_with("/race-lab/runs/"),
            "{run:?}: {address}"
        );
        let focused = client
            .execute(
                "return document.activeElement && document.activeElement.id;",
                vec![],
            )
            .await
            .expect("focus");
        assert_eq!(focused, json!("summary"), "focus moves to the result");

        // The page's rules, against the database.
        let harms = harms_in_the_database(&app, alice, preset).await;
        assert_the_page_tells_the_harm(client, &format!("{run:?}"), &harms, COUNT).await;
        let said = text_of(client, "#verdict").await;
        let all_on = cooldown == "on" && key == "atomic" && guard == "guarded" && run.keys == "same";
        if all_on && !preset.starts_with("overdraw") && preset != "crossing" {
            assert!(harms.is_empty(), "{run:?}: {harms:?}");
            assert_eq!(
                said, "This is what the layers at full strength should show.",
                "{run:?}"
            );
        }
        if !harms.is_empty() {
            assert!(
                said.starts_with("This is the damage let through with")
                    || said.starts_with("The layers that should stop this race were at full strength"),
                "{run:?}: {said}"
            );
        }
        let (moved, transfers): (i64, i64) =
            sqlx::query_as("SELECT moved_minor, transfers FROM race_lab_state($1)")
                .bind(alice)
                .fetch_one(&app.db)
                .await
                .expect("lab state");
        if preset == "same-key" && run.keys == "same" && transfers > 1 {
            assert!(
                summary.contains(&format!("One key was charged {transfers} times")),
                "{run:?}: {summary}"
            );
        }
        // The money and the funnel agree with the database, and the
        // timeline has one mark per request.
        if preset != "crossing" {
            let shown = text_of(client, "#moved").await;
            assert_eq!(shown, layered_wallet::web::money::format(moved, "LAB"), "{run:?}");
        }
        let funnel_moved = text_of(client, "#funnel li.stage-moved strong").await;
        assert_eq!(funnel_moved, transfers.to_string(), "{run:?}: the funnel's moved");
        assert_axis_reads_left_to_right(client, &format!("{run:?}")).await;
        let marks = client.find_all(Locator::Css("svg .mark")).await.expect("marks");
        assert_eq!(marks.len() as i64, COUNT, "{run:?}: one mark per request");
        assert_fire_again_repeats(client, &run, COUNT).await;

        if let Some(name) = run.picture {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(format!("{directory}/{name}.png"), png).expect("write screenshot");
            addresses.push((address.to_string(), name));
        }
    }

    // Money that leaves: every pair of payout switches against the lab
    // bank's own ledger. Every part of the saga on, each payout leaves
    // once; each switch that breaks it shows its damage, in red.
    for (payout, bank) in [
        ("outbox", "deduplicates"),
        ("outbox", "no_deduplication"),
        ("new_key_per_attempt", "deduplicates"),
        ("new_key_per_attempt", "no_deduplication"),
        ("call_in_transaction", "deduplicates"),
        ("call_in_transaction", "no_deduplication"),
    ] {
        client.goto(&app.url("/race-lab")).await.expect("open race lab");
        click(client, "input[name=preset][value=lost-answer]").await;
        fill(client, "#count", &COUNT.to_string()).await;
        click(client, &format!("#switch-payout option[value={payout}]")).await;
        click(client, &format!("#switch-bank option[value={bank}]")).await;
        click(client, "#fire").await;
        let summary = text_of(client, "#summary").await;
        let address = client.current_url().await.expect("url");
        let run = (payout, bank);
        let harms = harms_in_the_database(&app, alice, "lost-answer").await;
        assert_the_page_tells_the_harm(client, &format!("{run:?}"), &harms, COUNT).await;
        let (sendings, settled): (i64, i64) =
            sqlx::query_as("SELECT bank_sendings, payouts_settled FROM race_lab_state($1)")
                .bind(alice)
                .fetch_one(&app.db)
                .await
                .expect("lab state");
        if run == ("outbox", "deduplicates") {
            assert!(summary.starts_with("✓ No money was harmed"), "{run:?}: {summary}");
            assert_eq!((sendings, settled, harms.len()), (COUNT, COUNT, 0));
        } else {
            assert!(!harms.is_empty(), "{run:?}: no damage in the bank's ledger");
            assert!(summary.starts_with("✗ Money was harmed."), "{run:?}: {summary}");
        }
        if payout == "call_in_transaction" {
            // The damage is named in the headline: money sent for payouts
            // that do not exist.
            assert!(
                summary.contains("payouts that do not exist"),
                "{run:?}: {summary}"
            );
        }
        let shown_sendings = text_of(client, "#bank-note").await;
        let times = if sendings == 1 {
            "once".to_owned()
        } else {
            format!("{sendings} times")
        };
        assert!(shown_sendings.contains(&times), "{run:?}: {shown_sendings}");
        let name = match run {
            ("outbox", "deduplicates") => Some("race-lab-payouts"),
            ("outbox", "no_deduplication") => Some("race-lab-payouts-no-dedup"),
            _ => None,
        };
        if let Some(name) = name {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(format!("{directory}/{name}.png"), png).expect("write screenshot");
            addresses.push((address.to_string(), name));
        }
    }

    // A phone's width: each kept run fits without sideways scrolling, and
    // reopening it fires nothing.
    let transfers = app.transfer_count().await;
    client.set_window_size(390, 900).await.expect("narrow window");
    for (address, name) in &addresses {
        client.goto(address).await.expect("reopen a run");
        text_of(client, "#summary").await;
        let overflow = sideways_scroll_px(client).await;
        assert_eq!(overflow, json!(0), "{name} scrolls sideways at 390 px");
        assert_axis_reads_left_to_right(client, name).await;
        let smallest_text_px = client
            .execute(
                "return Math.min(...Array.from(document.querySelectorAll('#results *'))
                   .filter((e) => e.childNodes.length && Array.from(e.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim()))
                   .map((e) => parseFloat(getComputedStyle(e).fontSize)));",
                vec![],
            )
            .await
            .expect("font sizes");
        assert!(
            smallest_text_px.as_f64().expect("a size") >= 11.0,
            "{name}: text smaller than 11 px at 390 px: {smallest_text_px}"
        );
        // Every timeline mark is at least 8 px, and a tap on one tells its
        // request: nothing needs a hover.
        let smallest_mark_px = client
            .execute(
                "return Math.min(...Array.from(document.querySelectorAll('svg .mark'))
                   .map((m) => { const b = m.getBoundingClientRect(); return Math.min(b.width, b.height); }));",
                vec![],
            )
            .await
            .expect("mark sizes");
        assert!(
            smallest_mark_px.as_f64().expect("a size") >= 8.0,
            "{name}: a timeline mark smaller than 8 px at 390 px: {smallest_mark_px}"
        );
        client
            .execute("document.querySelector('svg .mark').dispatchEvent(new MouseEvent('click', {bubbles: true})); return true;", vec![])
            .await
            .expect("tap a mark");
        let told = text_of(client, "#mark-detail").await;
        assert!(
            told.starts_with("Request "),
            "{name}: a tapped mark tells nothing: {told}"
        );
        // The phone's picture shows the funnel and the timeline.
        client
            .execute("document.getElementById('funnel').scrollIntoView();", vec![])
            .await
            .expect("scroll");
        let png = client.screenshot().await.expect("screenshot");
        std::fs::write(format!("{directory}/{name}-390.png"), png).expect("write screenshot");
    }
    assert_eq!(
        app.transfer_count().await,
        transfers,
        "reopening a run fired nothing"
    );

    // Every other page fits a phone too, and the landing picture's words
    // stay inside their boxes at both widths.
    for width in [390, 1280] {
        client.set_window_size(width, 900).await.expect("window");
        for path in ["/", "/wallet", "/race-lab", "/feed"] {
            client.goto(&app.url(path)).await.expect("open a page");
            let overflow = sideways_scroll_px(client).await;
            assert_eq!(overflow, json!(0), "{path} scrolls sideways at {width} px");
        }
        client.goto(&app.url("/")).await.expect("open the landing page");
        let spilled = client
            .execute(
                "return Array.from(document.querySelectorAll('.layer-box'))
                   .filter((box) => box.scrollWidth > box.clientWidth || box.scrollHeight > box.clientHeight).length;",
                vec![],
            )
            .await
            .expect("boxes");
        assert_eq!(
            spilled,
            json!(0),
            "the landing picture's text leaves its box at {width} px"
        );
    }

    // A comparison of the balance guards, from its form: picking the layer
    // picks the burst that reaches it; the side-by-side page shows each
    // alternative and fits both widths.
    client.set_window_size(1280, 900).await.expect("wide window");
    client.goto(&app.url("/race-lab")).await.expect("open race lab");
    click(client, "#compared option[value=idempotency]").await;
    let burst = client
        .execute("return document.getElementById('compare-preset').value;", vec![])
        .await
        .expect("the burst");
    assert_eq!(burst, json!("same-key"), "the layer's burst is picked with it");
    click(client, "#compared option[value=row_guard]").await;
    fill(client, "#compare-count", &COUNT.to_string()).await;
    click(client, "#compare-fire").await;
    let compared = text_of(client, "#comparison").await;
    let address = client.current_url().await.expect("url");
    assert_eq!(address.path(), "/race-lab/comparisons", "{address}");
    for name in [
        "SELECT … FOR UPDATE",
        "optimistic version",
        "read-decide-write (naive)",
    ] {
        assert!(compared.contains(name), "{name}: {compared}");
    }
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(format!("{directory}/race-lab-compare.png"), png).expect("write screenshot");
    client.set_window_size(390, 900).await.expect("narrow window");
    client.refresh().await.expect("reload");
    text_of(client, "#comparison").await;
    let overflow = sideways_scroll_px(client).await;
    assert_eq!(overflow, json!(0), "the comparison scrolls sideways at 390 px");

    // The live feed, with the runs' decisions in it, fits the phone too;
    // lab amounts say they are lab money, and the real-only view hides them.
    client.goto(&app.url("/feed")).await.expect("open the feed");
    client
        .wait()
        .for_element(Locator::Css("#feed tbody tr"))
        .await
        .expect("the feed shows the runs' decisions");
    let overflow = sideways_scroll_px(client).await;
    assert_eq!(overflow, json!(0), "the feed scrolls sideways at 390 px");
    let first_amount = text_of(client, "#feed tbody tr:first-child td:nth-child(3)").await;
    assert!(first_amount.contains("LAB "), "{first_amount}");
    // Lab money moves between the lab wallets, named as the lab names them.
    let transfers: Vec<String> = serde_json::from_value(
        client
            .execute(
                "return Array.from(document.querySelectorAll('#feed tbody td:nth-child(3)')).map((td) => td.innerText);",
                vec![],
            )
            .await
            .expect("the transfer cells"),
    )
    .expect("texts");
    // The newest rows may all be deliveries or all transfers, whichever
    // runs came last: either names its lab wallet.
    assert!(
        transfers
            .iter()
            .any(|cell| cell.contains("to lab wallet B") || cell.contains("into lab wallet A")),
        "{transfers:?}"
    );
    assert!(transfers.iter().all(|cell| !cell.contains('…')), "{transfers:?}");
    click(client, "#feed-money option[value=real]").await;
    let visible = client
        .execute(
            "return Array.from(document.querySelectorAll('#feed tbody tr')).filter((tr) => !tr.hidden).length;",
            vec![],
        )
        .await
        .expect("visible rows");
    assert_eq!(visible, json!(0), "alice made no real transfer");

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

/// A payout from the wallet page: review, a double-clicked confirmation,
/// the money set aside at once and shown as such, then paid out once.
/// Saves a screenshot of each step for the documentation
/// (`scripts/screenshots`).
#[tokio::test]
async fn a_payout_from_the_wallet_page_is_reviewed_set_aside_and_paid_out_once() {
    let gateway = wallet_testkit::gateway::Gateway::start(
        &wallet_testkit::gateway::wallet_sim_binary(),
        &["--latency-ms", "1500"],
    )
    .await;
    let app = spawn_app(|settings| {
        with_payouts(&gateway.url)(settings);
        // The slow gateway must answer within the call's time-out.
        settings.payout_call_timeout_ms = 5_000;
        settings.payout_lease_ms = 10_000;
    })
    .await;
    let browser = browser().await;
    let client = &browser.client;
    sign_up_in_browser(&app, client, "alice").await;

    fill(client, "#destination", "acct-42").await;
    fill(client, "#payout-amount", "25.00").await;
    click(client, "#review-payout").await;
    assert_eq!(
        text_of(client, "#review-heading").await,
        "Pay out $25.00 to acct-42?"
    );
    let directory = std::env::var("SCREENSHOT_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/screenshots").to_owned());
    std::fs::create_dir_all(&directory).expect("screenshot directory");
    let picture = |name: &'static str| {
        let directory = directory.clone();
        async move {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(format!("{directory}/{name}.png"), png).expect("write screenshot");
        }
    };
    picture("payout-review").await;
    client
        .execute(
            "const b = document.getElementById('pay-out'); b.click(); b.click(); return true;",
            vec![],
        )
        .await
        .expect("double click");
    let notice = text_of(client, "#notice").await;
    assert!(
        notice.contains("$25.00 is set aside for acct-42"),
        "unexpected notice: {notice}"
    );
    assert_eq!(text_of(client, "#balance").await, "$975.00");
    let held = text_of(client, "#held").await;
    assert!(
        held.contains("$25.00 is set aside") && held.contains("$1,000.00"),
        "{held}"
    );
    picture("payout-set-aside").await;

    let payout: uuid::Uuid = sqlx::query_scalar("SELECT id FROM payouts")
        .fetch_one(&app.db)
        .await
        .expect("exactly one payout");
    app.wait_for_payout(payout, &["settled"]).await;
    client.goto(&app.url("/wallet")).await.expect("reload");
    let payouts = text_of(client, "#payouts").await;
    assert!(
        payouts.contains("acct-42") && payouts.contains("paid out"),
        "{payouts}"
    );
    client
        .execute("document.getElementById('payouts').scrollIntoView();", vec![])
        .await
        .expect("scroll");
    picture("payout-paid-out").await;
    let history = text_of(client, "table.history:not(#payouts)").await;
    assert!(history.contains("Sent to bank account acct-42"), "{history}");
    assert!(
        client.find(Locator::Css("#held")).await.is_err(),
        "nothing is set aside once paid out"
    );
    assert_eq!(app.balance(app.wallet_of("alice").await).await, 97_500);

    // On a phone, the wallet id, the bank account and the history wrap
    // between words or after a hyphen, never inside a word; and a payout
    // over the balance is said in words, with Pay out disabled.
    client.set_window_size(390, 900).await.expect("narrow window");
    client.goto(&app.url("/wallet")).await.expect("reload");
    let mid_word = breaks_mid_word(client, "#wallet-id, #payouts td, table.history td").await;
    assert!(mid_word.is_empty(), "{mid_word:?}");
    fill(client, "#destination", "acct-42").await;
    fill(client, "#payout-amount", "975.01").await;
    click(client, "#review-payout").await;
    let short = text_of(client, "#review-short").await;
    assert!(
        short.contains("Your wallet does not hold enough for this payout: you can spend $975.00"),
        "{short}"
    );
    let pay_out = client.find(Locator::Css("#pay-out")).await.expect("the button");
    assert!(
        pay_out.attr("disabled").await.expect("attr").is_some(),
        "Pay out is offered for more than the wallet holds"
    );
    let mid_word = breaks_mid_word(client, "#review-heading, dl.review dd, #review-short").await;
    assert!(mid_word.is_empty(), "{mid_word:?}");
    client.set_window_size(1280, 900).await.expect("wide window");

    // The live feed has the request's decision and the bank's answer, each
    // saying the money went to a bank account.
    client.goto(&app.url("/feed")).await.expect("open the feed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let rows: Vec<String> = serde_json::from_value(
            client
                .execute(
                    "return Array.from(document.querySelectorAll('#feed tbody tr')).map((tr) => tr.textContent);",
                    vec![],
                )
                .await
                .expect("rows"),
        )
        .expect("texts");
        if rows.iter().any(|row| row.contains("Bank gateway")) || std::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        rows.iter()
            .any(|row| row.contains("Bank gateway: accepted")
                && row.contains("25.00 paid out to a bank account")),
        "{rows:?}"
    );
    assert!(
        rows.iter().any(
            |row| row.contains("Row guard: accepted") && row.contains("25.00 paid out to a bank account")
        ),
        "{rows:?}"
    );
    browser.quit().await;
}
