// SmokeTest drives idem's mobile facade from Java through gobind's
// bindings, as an Android app would, against a fake server whose URL is the
// first argument. It prints one line per check, "PASS name" or
// "FAIL name: why", and exits 1 if any check failed.
import java.io.File;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.concurrent.atomic.AtomicInteger;

import dev.idem.mobile.AttemptEvent;
import dev.idem.mobile.Authorizer;
import dev.idem.mobile.Cancel;
import dev.idem.mobile.Client;
import dev.idem.mobile.Config;
import dev.idem.mobile.IntentList;
import dev.idem.mobile.Listener;
import dev.idem.mobile.Mobile;
import dev.idem.mobile.Result;

public class SmokeTest {
    static String server;
    static File root;
    static int failed = 0;
    static int dirs = 0;

    interface Check { void run() throws Exception; }

    static void check(String name, Check c) {
        try {
            c.run();
            System.out.println("PASS " + name);
        } catch (Throwable t) {
            failed++;
            System.out.println("FAIL " + name + ": " + t);
        }
    }

    static void expect(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static void admin(String method, String path, String body) throws Exception {
        HttpURLConnection c = (HttpURLConnection) new URL(server + path).openConnection();
        c.setRequestMethod(method);
        if (body != null) {
            c.setDoOutput(true);
            try (OutputStream o = c.getOutputStream()) { o.write(body.getBytes(StandardCharsets.UTF_8)); }
        }
        int code = c.getResponseCode();
        if (code >= 300) throw new AssertionError(method + " " + path + ": " + code);
        c.disconnect();
    }

    static Config config(long maxAttempts) throws Exception {
        File dir = new File(root, "state-" + (dirs++));
        Config cfg = Mobile.newConfig(dir.getPath(), server);
        cfg.setMark("echo");
        cfg.setMaxAttempts(maxAttempts);
        cfg.setForegroundBudgetMillis(20_000);
        return cfg;
    }

    static byte[] cart(int amount, String customer) {
        return ("{\"amount\":" + amount + ",\"currency\":\"AZN\",\"customer\":\"" + customer + "\"}")
            .getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        server = args[0];
        root = Files.createTempDirectory("idem-jvm").toFile();

        check("lost response is replayed", () -> {
            admin("POST", "/_fake/faults", "{\"fault\":\"drop_response\",\"path\":\"/payments\"}");
            AtomicInteger events = new AtomicInteger();
            Config cfg = config(5);
            cfg.setListener(new Listener() {
                public void onAttempt(AttemptEvent e) { events.incrementAndGet(); }
            });
            Client c = Mobile.open(cfg);
            Result r = c.pay("checkout:lost", "/payments", cart(1500, "cus_1"), null);
            c.close();
            expect(r.getOutcome().equals(Mobile.OutcomeSucceeded), "outcome " + r.getOutcome());
            expect(r.getKind().equals(Mobile.KindSucceeded), "kind " + r.getKind());
            expect(r.getReplayed(), "replayed");
            expect(r.getAttempts() == 2, "attempts " + r.getAttempts());
            expect(r.getStatus() == 201, "status " + r.getStatus());
            expect(events.get() == 2, "listener events " + events.get());
        });

        check("decline is a result", () -> {
            Client c = Mobile.open(config(5));
            Result r = c.pay("checkout:decline", "/payments", cart(1500, "cus_declined"), null);
            Result again = c.payAnew("checkout:decline", "/payments", cart(1500, "cus_declined"), null);
            c.close();
            expect(r.getOutcome().equals(Mobile.OutcomeFailed), "outcome " + r.getOutcome());
            expect(r.getKind().equals(Mobile.KindFailed), "kind " + r.getKind());
            expect(r.getStatus() == 402, "status " + r.getStatus());
            expect(r.getProblemType().endsWith("card-declined"), "problem " + r.getProblemType());
            expect(!again.getKey().equals(r.getKey()), "pay anew makes a new key");
        });

        check("cancel from another thread returns promptly", () -> {
            admin("POST", "/_fake/faults", "{\"fault\":\"delay\",\"path\":\"/payments\",\"delay_ms\":20000}");
            Client c = Mobile.open(config(5));
            Cancel cancel = new Cancel();
            Thread t = new Thread(() -> {
                try { Thread.sleep(300); } catch (InterruptedException e) { }
                cancel.cancel();
            });
            long start = System.nanoTime();
            t.start();
            String kind = "none";
            try {
                c.pay("checkout:cancel", "/payments", cart(1500, "cus_1"), cancel);
            } catch (Exception e) {
                kind = Mobile.errorKind(e);
            }
            long ms = (System.nanoTime() - start) / 1_000_000;
            t.join();
            admin("DELETE", "/_fake/faults", null);
            c.close();
            expect(kind.equals(Mobile.KindCanceled), "error kind " + kind);
            expect(ms < 10_000, "returned after " + ms + " ms");
        });

        check("changed cart is blocked while the previous intent is unresolved", () -> {
            admin("POST", "/_fake/faults", "{\"fault\":\"status\",\"path\":\"/payments\",\"status\":503,\"count\":2}");
            Client c = Mobile.open(config(2));
            Result first = c.pay("checkout:changed", "/payments", cart(1500, "cus_1"), null);
            Result changed = c.pay("checkout:changed", "/payments", cart(2500, "cus_1"), null);
            c.close();
            expect(first.getOutcome().equals(Mobile.OutcomeUnknown), "first " + first.getOutcome());
            expect(first.getKind().equals(Mobile.KindUnknown), "first kind " + first.getKind());
            expect(changed.getOutcome().equals(Mobile.OutcomeBlocked), "changed " + changed.getOutcome());
            expect(changed.getKey().equals(first.getKey()), "names the blocking intent");
        });

        check("directory lock is reported", () -> {
            Config cfg = config(5);
            Client c = Mobile.open(cfg);
            String kind = "none";
            try {
                Mobile.open(cfg);
            } catch (Exception e) {
                // The exception itself: gobind hands the Go error back.
                kind = Mobile.errorKind(e);
            }
            c.close();
            expect(kind.equals(Mobile.KindLocked), "error kind " + kind);
        });

        check("an exception of another origin is of kind internal", () -> {
            String kind = Mobile.errorKind(new java.io.IOException("idem[locked]: not ours"));
            expect(kind.equals(Mobile.KindInternal), "error kind " + kind);
        });

        check("a changed cart of a paid action is already paid", () -> {
            Client c = Mobile.open(config(5));
            Result first = c.pay("checkout:paid", "/payments", cart(1500, "cus_1"), null);
            Result changed = c.pay("checkout:paid", "/payments", cart(2500, "cus_1"), null);
            c.close();
            expect(first.getOutcome().equals(Mobile.OutcomeSucceeded), "first " + first.getOutcome());
            expect(changed.getOutcome().equals(Mobile.OutcomeAlreadyPaid), "changed " + changed.getOutcome());
            expect(changed.getKind().equals(Mobile.KindAlreadyPaid), "kind " + changed.getKind());
            expect(changed.getKey().equals(first.getKey()), "names the payment that paid the action");
            expect(java.util.Arrays.equals(changed.getBody(), first.getBody()), "its stored answer");
        });

        check("restart then resume reuses the same key", () -> {
            admin("POST", "/_fake/faults", "{\"fault\":\"status\",\"path\":\"/payments\",\"status\":503}");
            Config cfg = config(1);
            Client c = Mobile.open(cfg);
            Result first = c.pay("checkout:restart", "/payments", cart(1500, "cus_1"), null);
            c.close();
            cfg.setMaxAttempts(5);
            Client again = Mobile.open(cfg);
            IntentList list = again.unresolved();
            expect(list.len() == 1, "unresolved " + list.len());
            expect(list.get(0).getKey().equals(first.getKey()), "same key");
            Result r = again.settle(first.getKey(), null);
            again.close();
            expect(first.getOutcome().equals(Mobile.OutcomeUnknown), "first " + first.getOutcome());
            expect(r.getOutcome().equals(Mobile.OutcomeSucceeded), "settled " + r.getOutcome());
            expect(r.getKey().equals(first.getKey()), "settled under the first key");
        });

        check("an authorizer that throws is not sent, of kind authorizer", () -> {
            Config cfg = config(5);
            cfg.setAuthorizer(new Authorizer() {
                public String authorize(String key) throws Exception {
                    throw new IllegalStateException("no session");
                }
            });
            Client c = Mobile.open(cfg);
            Result r = c.pay("checkout:auth", "/payments", cart(1500, "cus_1"), null);
            c.close();
            expect(r.getOutcome().equals(Mobile.OutcomeNotSent), "outcome " + r.getOutcome());
            expect(r.getKind().equals(Mobile.KindAuthorizer), "kind " + r.getKind() + " (" + r.getDetail() + ")");
        });

        System.out.println(failed == 0 ? "ALL PASSED" : failed + " FAILED");
        System.exit(failed == 0 ? 0 : 1);
    }
}
