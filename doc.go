/*
Package idem makes retrying non-idempotent HTTP requests safe.

A phone sends POST /payments, the server charges the card, the response is
lost. The app cannot know whether the charge happened, so it retries, and
without protection the customer pays twice. idem is the client side of the
Idempotency-Key contract (the IETF httpapi draft "The Idempotency-Key HTTP
Header Field", as deployed by Stripe and others): every attempt of one user
action carries the same key and the same bytes, so the server does the work
once and replays its answer to the repeats.

# Intents

An [Intent] is one thing the user means to do: pay for this cart. It gets
one Idempotency-Key (a random UUID) when it is created, for example when
the Pay button is shown ([Client.Intent]). Until the user taps it lives in
memory only; the tap arms it: its first [Client.Do] saves it in a
[persist.Store] before anything is sent, and if saving fails, nothing is
sent. An intent never armed is never sent by anything but a call the app
makes for it in that process: after a restart only intents whose sending
had begun are resumed or settled, and a crash before the tap loses only a
key that was never used.
Every attempt, including those after a crash and restart, sends the same
method, URL, headers, key and body bytes: they are fixed when the intent is
created and stored with it, the key's spelling (bare, or quoted with
[Server.QuotedKey]) included, so a later change of the Client's options never
changes what an existing intent sends. A changed cart is a new intent with a
new key.

[Client.Send] is the one call for a Pay button: it creates the intent for
an action name (or takes the one already there for the same request),
sends it, and returns the final answer; the stored one, without sending,
once the outcome is known. It returns an [*UnresolvedError] instead of
starting a second payment while the previous one's outcome is unknown.

	client, err := idem.New(idem.Config{Store: store,
		Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	...
	resp, err := client.Send(ctx, "checkout:cart-42", req)

At app start, [Client.SettleAll] settles what an earlier run left
unresolved, each intent with its own key, and reports what became of each.
[Client.Settle] does it for one intent: it resends the intent while the
server still keeps its key, and asks the server's lookup ([Server.Lookup])
after that. [Client.Intent] and [Client.Do] are the two halves of Send, for
apps that show the key or hold the intent between the tap and the send.
Intent looks at the action's latest intent (the one created last, by a
sequence number stored with each intent, not by the device's clock, which
the user may set back). Once an action has succeeded, a changed request for
it is refused with a [*ResolvedError] carrying the earlier answer (the same
order, with the server's URL spelled another way, is not paid twice);
a deliberate second payment is [Client.NewIntent].

Several Clients may share one store (two parts of an app, each with its
own): the store decides which intent is an action's latest when one is
armed (persist.Claim, which persist's own stores do in one step), so two
Clients never arm two intents for one action. An armed intent names the
Client that armed it (persist.Record.Holder); a Client that resumes an
armed intent it did not arm takes it over first, in one step with the store
([persist.SaveIf]; one extra write, on resumes only), and a changed cart
replaces an intent only if no other Client took it over since it was read
([persist.DeleteIf]). So a Client tells an intent unsent, records it not
sent or replaces it only while no other Client can have sent it.

# States

An intent is new (unarmed, or armed and this process knows it was never sent), pending
(may have reached the server, outcome unknown), succeeded (2xx), failed (a final business
answer such as 402), rejected (422, or a 400 about the key), expired (outcome
unknown and too old to send again), void (reconciled: the server never did
it) or not sent (no request of it left the device; see "Not sent means not
sent"). The final answer is stored with a resolved intent: its status, its body
(unless larger than [Server.MaxResponseBytes]: [Response.Oversized]), and of its
header fields only Content-Type, Location, Idempotent-Replayed, Retry-After
and those named with [Server.StoredHeaders]. Cookies, tokens and every other field of an answer are
never written. The request's own header fields are stored with the intent:
put credentials in the http.Client's transport, not in the Request's
Header.

To keep to one durable write per successful intent on the path the user
waits on (the arming at the tap; the outcome's save is made durable in the
background, see package persist), the first attempt is not recorded: after a crash a new intent may have been sent.
Resuming it is safe because it reuses its key; only an intent that this
Client created and never sent is treated as certainly unsent, and only such
an intent reads new ([Intent.State]): after a restart, one stored as new
reads pending.

# Retries

Do retries network errors (including those after the request was written,
and a response body cut off mid-way), 408, 409 (request in progress), 429,
every 5xx (a CDN's 520-524 as much as the origin's 500: a 5xx says nothing
about whether the work was done) and every status outside 100-599, with
capped exponential backoff and jitter ([RetryPolicy]); when retrying stops
without a final answer, the outcome is unknown. An answer marked
Idempotent-Replayed: true that is the server's word is its stored record
for the key and is final whatever its status: it is stored and never retried. A Retry-After on any of them, in delta-seconds or any
HTTP-date form, is honoured: the next attempt is never sooner than the
server asked, and up to a fifth of the jitter later (10% by default), so
that clients told the same Retry-After do not return in the same instant;
that spread is dropped rather than let it exceed the budget. A Retry-After
above the cap, or a wait that would pass the
context's deadline or the call's time budget, ends the call at once with a
[*RetryError] that carries the refused wait.

It never retries any other 4xx answer: those are final, when they are the
server's (see "Whose word settles an intent" below). Among them, an answer that
says the key was used with another request (a bug, surfaced as an
[*APIError] matching [ErrKeyReused]) is recognised by what it says, not by
its status: the contract's problem type on a 422, Stripe's error of type
idempotency_error, or what [Server.KeyReusedAnswer] recognises for the app's
own server. Any other 422 is an ordinary final answer. A 400 about the key
itself matches [ErrKeyRejected].

An error that proves the request never reached the server (its TLS
certificate refused or naming another host, a plain HTTP answer to HTTPS, a
redirect loop or a redirect to a scheme that is not http or https) is not
retried either: no retry can fix it. What can be known when the intent is
created (a scheme other than http or https, no host name, a bad port) is
refused then.

# Not sent means not sent

A phone in a lift or in airplane mode cannot dial: the connection is
refused, the host is not found, the network is unreachable, the dial times
out, the TLS handshake is refused before the request. Such errors are
retried within the call's budget (the network may come back), and when no
attempt of the call wrote its request to a connection, and no attempt
before it can have, the call ends with an error matching
[ErrNotSent] (not [ErrOutcomeUnknown]): nothing reached the server.

That is proved by the transport's client trace ([net/http/httptrace]),
never guessed from an error's type or text: every attempt must have looked
for a connection (GetConn) and none may have written its request
(WroteHeaders), got a connection or got an answer. A transport that fires
no trace (a custom RoundTripper that is not net/http's) never gets "not
sent"; nor does a call in which net/http wrote the request on a reused
connection and then failed to resend it on a new one, since the first copy
may have been read.

The intent is then stored as not sent ([StateNotSent]): [Client.Intent]
replaces it for a changed cart, after a restart too, and [Client.SettleAll]
does not send it (the app told its user it was not sent); Send, Settle or
Do send it again when the app asks, storing it as new first, so that a
crash during that send cannot leave it replaceable. Only a call that ended
not sent writes that record: a paid intent still costs one durable write
on the user's path.

# Whose word settles an intent

Anything between the device and the server can answer a request: a CDN's
404 page or a single-page app's index.html on the lookup URL, an API
gateway's 401 when a session expired between two attempts, a WAF's 403, a
proxy's 407, a captive portal's 200 login page. None of them knows what
became of the payment, so idem never lets such an answer settle an intent.
An answer is the server's word when it carries the intent's key back in an
Idempotency-Key header field (bare or as an RFC 8941 sf-string), as the
contract's servers and Stripe's API echo it, or when the server's declared
[Mark] recognises it. Idempotent-Replayed: true alone is not the mark: a
cache that kept another intent's replay serves it to every POST of the URL.

The app declares the mark up front, in [Server.Mark]: [New] refuses a
Config without one, so a server that marks nothing is found at setup, not
at the first payment. [MarkEcho] is a server that echoes the key (idem's
middleware, fakeserver, the contract's servers); [MarkStripe] and
[MarkAdyen] are those APIs, which echo it too. [MarkIncrease] is Increase,
which marks only its replays: its first answer is recognised by the key in
the created object's idempotency_key field. [MarkJSONID] is a plain server
that marks nothing: its 2xx JSON answer carrying the resource's id is its
word, never a page in HTML, an empty body or a 4xx. [MarkRecognizer] is the
app's own test. No Mark recognises an answer by its status alone.

  - A 2xx answer to a send settles the intent only when it is the server's
    word: a captive portal's 200 login page answers a phone's first POST as
    readily as a retry. An unmarked 2xx ends the call at once with a
    [*RetryError] matching [ErrOutcomeUnknown] (its Reason: the answer is
    not marked as the server's; its LastResponse holds the answer), and
    the intent stays unresolved.
  - An unmarked 4xx is never the server's word, on a first attempt or
    any other, whatever the Mark: it ends the call with its outcome
    unknown like a 2xx. A WAF's response rule may swap the server's 201 for
    its own 403 after the server charged. A gateway that refused a retry
    says nothing about the attempt that charged. The call does not send
    again in a loop: settle the intent later ([Client.Settle],
    [Client.Reconcile]); the server then replays its record, or its lookup
    says what became of it.
  - A replayed answer is final whatever its status, but a redirect's (see
    "Redirects").
  - The lookup ([Client.Reconcile]) makes an intent succeeded only on a
    2xx that is the server's word on its key: the key's echo, or a body
    that names the key (MarkIncrease), or, for a recognizer that reads no
    key (MarkJSONID, MarkRecognizer), the echo of the lookup's nonce
    without an Age field. A cache that ignores the query string serves
    one key's lookup to another's; only a cache that copies request
    header fields into a kept answer, and adds no Age, could still fool a
    recognizer that reads no key. It makes an intent void only on the lookup's typed
    miss, a 404 problem of type
    https://idem.dev/problems/idempotency-key-unused (or a 404 that a
    [MarkRecognizer] recognises), that echoes the fresh nonce the lookup
    sent in Idempotency-Lookup-Nonce: a miss a cache kept from before the
    payment does not. The echo alone never voids an intent:
    a gateway that copies request header fields into its own answers could
    forge it. Any other answer is "cannot tell yet" and changes nothing.

A gateway that copies the request's header fields into its own answer
would forge the key's echo. So the attempts of a call carry a random nonce
in Idempotency-Attempt-Nonce, which no server sends back: an answer that
carries it is a reflection, never the server's word. A gateway that
copies the key alone, and not the nonce, still defeats the mark; the
contract asks that nothing on the path do so.

One budget governs a call: [RetryPolicy.MaxAttempts], [RetryPolicy.MaxElapsed]
and the context's deadline; the first to run out ends it, inside an attempt
too (a server that never answers, or trickles its answer, cannot hold Do
past it whatever the http.Client's Timeout), and the *RetryError says which
([RetryError.Reason]), with the attempt count and the last answer. The
outcome is then unknown ([ErrOutcomeUnknown]) and the intent stays pending:
Settle or Do it again later. [ContextWithRetryPolicy] gives the calls made
with a context a budget of their own, a short one for a tap and a long one
for a background settle, from one Client.

Beside each call's budget, a Client keeps one retry budget for all its
calls ([RetryBudget], on by default, [Config].RetryBudget): a bucket of 500
tokens from which a retry takes 5 (10 after an attempt that timed out), to
which a final answer of the server's (one it marked) puts back what its retry
took (one token after a first attempt), and to which a token comes back each second on the Client's
clock. A first attempt never needs a token. A call whose next retry finds
too few ends at once with its outcome unknown (its Reason: the
client-wide retry budget is spent). On a lossy network the answers refund
the retries: 100 payments at once with 30% of their answers lost all end
paid. Against a dead server nothing refunds: 100 calls at once make 100
first attempts and at most 112 retries in the first minute, not the 700
attempts of their policies, and the Client retries at most once every
five seconds after it. [RetryBudget] argues these defaults against the
AWS SDKs'.

[New] checks every option and fails, naming each option out of range and
what to pass instead, rather than replace it with a default: a RetryPolicy
field out of range, a nil store, http.Client or clock, a negative delay or
size, a header field to store that carries credentials. A policy out of
range given by [ContextWithRetryPolicy] fails the calls made with it,
before anything is armed or sent.

Retries are built on github.com/hashicorp/go-retryablehttp with per-call
hooks, and backoff on github.com/cenkalti/backoff/v4, one backoff per call.

# Redirects

307 and 308 are followed with the same method, headers (the key spelled as
stored) and body bytes, up to 10 in a row; never from https to http. 301,
302 and 303 would turn the POST into a GET whose answer (a login page, a
CDN's notice) says nothing about the payment, so Do does not follow them;
the RoundTripper hands them back to the app's http.Client, whose GET then
passes with no key and no intent.

An answer from another origin (scheme, host, port) than the request's,
reached by a followed 307 or 308, is the server's word only by the key's
echo. No Mark's recognizer reads it: a captive portal that redirects the
POST to its own JSON API answers {"id": "sess_..."}, which MarkJSONID
would take for a payment. Without the echo, the call ends with the outcome
unknown.

One redirect is an outcome: a 303 See Other that the server marked as its
own (the key's echo) is its word that the
work was done, and its Location names the result. The intent succeeds, on
the first answer or on the replay a retry gets after a lost one. Every
other redirect (301, 302, a 307 or 308 that was not followed, an unmarked
303), marked or not, is neither paid nor failed: the call ends at once
with a [*RetryError] matching [ErrOutcomeUnknown] (its Reason: a redirect
not followed), whose LastResponse holds the 3xx and its Location; fix what
redirects, then resume the intent with Do or settle it with Reconcile. No
redirect is ever stored as failed.

The server fingerprints the path and the query, so a 307 or 308 to another
URL (an edge's "/payments?via=edge") makes the followed request another
request to it under the same key: if that one charged and its answer was
lost, the retry to the intent's own URL gets a "key reused" 422. Once an
attempt of the intent was redirected to another URL (the intent's record
keeps it, across restarts), such an answer is not final: the call ends with
the outcome unknown and the intent stays pending; Settle asks the server's
lookup, rather than resend to a URL that whoever redirected named. Without
such a redirect the 422 is final ([ErrKeyReused]).

# Retention

A server keeps idempotency records for a retention period (24 hours by
default); after it, the key counts as new and a resend would do the work
again. The Client therefore stops sending a key once its intent is older
than the retention less a safety margin ([Server.Retention]): Do returns a
*RetryError, the intent's State is persist.StateExpired, and [Client.Settle]
settles the intent with the server's lookup by key ([Client.Reconcile]). A
server without such a lookup leaves the app to settle an expired intent some
other way (a list of recent payments, support), and Settle says so.

# Reconciling

[Client.Reconcile] asks the server's lookup by key what became of an intent.
A "not found" is trusted only once no attempt of the intent can still
arrive: a request can be held in a slow uplink or a proxy's queue, or sent
by a process that died before it recorded the attempt. The client assumes
that a request reaches the server's record within the reconcile delay
([Server.ReconcileDelay]) after it was last written, and it knows, without a
durable write, the latest moment an attempt can have been written: never,
for an intent it created and never sent; the end of its own last call of
the intent; otherwise its own creation, since only an earlier process, now
gone, can have sent it. An intent that is expired waits like any other. A
request held longer than the reconcile delay is the one case the client
cannot guard against alone.

# The device's clocks

The user can set the device's clock, networks set it wrong, and a phone
sleeps: Go's monotonic reading (and so every t.Sub(u) between two
time.Now readings) stops while it does, on Linux, Android, Darwin and iOS.
Every decision on an intent's age reads every clock the device has and
takes the safe answer:

  - the wall clock, read without Go's monotonic reading (t.Round(0));
  - a clock that counts device sleep (a Clock with SinceBoot; CLOCK_BOOTTIME on Linux
    and Android, CLOCK_MONOTONIC_RAW on Darwin and iOS, read without cgo),
    stored with the record at the arming and at every write with the
    boot's identity, and compared only within one boot;
  - the wall clock's high-water mark, the latest wall time the Client has
    seen, stored with every record, which a clock set back cannot lower;
  - the in-process monotonic clock, since this Client first saw the intent.

Stopping before the server's retention takes the largest age any of them
reports, read again before every attempt and every wait, so a device that
sleeps through a backoff does not wake up to resend a key the server has
forgotten. Trusting a lookup's "not found" after the reconcile delay, and
[Client.Prune], take the smallest (wait longer, keep longer). Which intent
of an action is the latest is a sequence number stored with each intent,
never a clock. A clock jumping forward makes intents expire early, which is
safe: they are reconciled; a wall clock set back delays trusting a "not
found" by as much.

What cannot be protected: on a system with no clock that counts sleep
(Windows, the BSDs, or a sandbox that hides the boot's identity, where
clock.System's SinceBoot reports none), or across a reboot, an intent's
age rests on the wall clock and its high-water mark, so a clock set back
while the app was not running, by more than the safety margin and past
every wall time the app had stored, makes an older intent look younger,
and it may be sent after the server forgot its key. Darwin's kern.boottime,
the boot's identity there, moves when the wall clock is set, which makes
the sleep-counting readings of earlier writes unusable (the other clocks
remain). A Retry-After given as a date is read against the wall clock.

# Sending through any http.Client

[Client.RoundTripper] wraps a transport so that any *http.Client, such as a
generated API client, sends POST and PATCH with a key and retries them
safely. The key comes from an intent carried in the request's context
([ContextWithIntent]); without one, the request's own Idempotency-Key is
kept if it has one, and otherwise a key is made for that request in memory
and does not survive a restart. GET and the other idempotent methods never
carry a key.

# Observing

[Config].OnAttempt hears of every attempt: the intent's key and action name,
its URL (credentials redacted), its number, status or error, how long it
took on the Client's clock, whether and after what wait another
follows, and the call's context ([Attempt].Context: the caller's trace span
and log values). [Client.SettleAll] reports each intent as its settle ends
(Config.SettleProgress) and settles a few at a time, four by default
(Config.SettleConcurrency). examples/otel, a module of its own, traces
calls by OpenTelemetry's HTTP conventions: a CLIENT span per request
(otelhttp's Transport) under a span per intent, the caller's span above
it, http.request.resend_count on each resend, and no credential in
url.full.

# Concurrency

A [Client] is safe for concurrent use. Two goroutines calling Do on the same
intent (a double tap) never put two requests on the wire at once: the second
waits for the first and both get the same outcome. Each caller's result
follows its own context: a waiter whose context ends gets an unknown outcome
([ErrOutcomeUnknown]) at once, and when the first call ends only because its
caller cancelled, a waiter with time left takes the call over with the same
key.

# Configuration

Each kind of setting has one style:

  - Settings are structs whose zero fields take documented defaults, as
    everywhere in this module. The Client's are one [Config], given to
    [New]; a Client never changes after New.
  - What the Client knows of the app's server is a struct of its own,
    [Server] (Config.Server): its lookup, its retention, how it spells keys
    and marks its answers. Its zero fields are the contract's defaults.
  - The policy of a call is a struct, [RetryPolicy]: the Client's default
    in Config.RetryPolicy, and one call's, from its context, with
    [ContextWithRetryPolicy]; its zero fields keep the Client's values.
  - A store's settings are a struct given to its constructor
    (persist.Options to persist.OpenDir and persist.NewMemory).

# Testing

The fakeserver package implements the server side of the contract with
faults on demand (lost responses, crashed workers, 503s); test against it
rather than against a hand-made mock. Give the client (Config.Clock) and the
fake server the same clock.Manual, and backoff, Retry-After, leases and
retention pass without sleeping. [Client.HTTPRequest] builds the exact
request of an intent for an http.Client that idem does not manage.
*/
package idem
