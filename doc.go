/*
Package idem makes retrying non-idempotent HTTP requests safe.

A phone sends POST /payments, and the server charges the card. Then the
response is lost. The app cannot know whether the charge happened, so it
retries. Without protection the customer pays twice. idem is the client
side of the Idempotency-Key contract. That is the IETF httpapi draft "The
Idempotency-Key HTTP Header Field", as Stripe and others deploy it. Every
attempt of one user action carries the same key and the same bytes. So the
server does the work once and replays its answer to the repeats.

docs/CLIENT.md gives the rules below in full, one topic at a time.

# Intents

An [Intent] is one thing the user means to do: pay for this cart. It gets
one Idempotency-Key when it is created. Its method, URL, header fields,
key and body bytes are fixed then and stored with it. So every attempt
sends the same bytes, after a crash and a restart too. A changed cart is a
new intent with a new key.

[Client.Send] is the one call for a Pay button. It creates the intent for
an action name, or takes the one already there for the same request. It
sends the intent and returns the final answer. Once the outcome is known,
it returns the stored answer without sending.

	client, err := idem.New(idem.Config{Store: store,
		Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	...
	resp, err := client.Send(ctx, "checkout:cart-42", req)

[Client.Intent] and [Client.Do] are the two halves of Send. They serve apps
that show the key, or hold the intent between the tap and the send. Until
the tap, an intent lives in memory only. Its first Do saves it in a
[persist.Store] before anything is sent. If saving fails, nothing is sent.

At app start, [Client.SettleAll] settles what an earlier run left
unresolved. [Client.Settle] does it for one intent. It resends the intent
while the server still keeps its key. After that it asks the server's
lookup ([Server.Lookup]), through [Client.Reconcile].

# Outcomes

A call ends one of these ways:

  - A 2xx that is the server's word: the work was done.
  - An [*APIError]: the server's final answer, such as a declined card.
    [ErrKeyReused] and [ErrKeyRejected] mark bugs in the app.
  - An error matching [ErrOutcomeUnknown]: no final answer came. The
    intent keeps its key. Settle it later, and never pay anew.
  - An error matching [ErrNotSent]: no request of it left the device.
  - An [*UnresolvedError] or a [*ResolvedError]: the action's previous
    intent is unresolved or paid, and the request changed. Nothing is
    sent. [Client.NewIntent] makes a deliberate second payment.

Do retries network errors, 408, 409, 429 and every 5xx, with capped
exponential backoff and jitter ([RetryPolicy]). It honours Retry-After.
Every other 4xx is final: stored, never retried. One budget governs a
call: [RetryPolicy.MaxAttempts], [RetryPolicy.MaxElapsed] and the context's
deadline. The first to run out ends the call with a [*RetryError]. A
Client also keeps one [RetryBudget] for all its calls.

# Whose word settles an intent

Anything between the device and the server can answer a request, such as
a captive portal's 200 login page. None of them knows what became of the
payment. So only the server's word settles an intent. An answer is the server's word when it echoes the intent's key, or
when the server's declared [Mark] recognises it. [New] refuses a Config
without [Server.Mark]. No Mark recognises an answer by its status alone.

# Clocks

An intent too old for the server's retention is never sent again
([Server.Retention]). The user may set the device's clock, and a phone
sleeps. So an intent's age reads every clock the device has, and takes the
safe answer. Those are the wall clock and its high-water mark, a clock that
counts sleep, and the in-process clock. A clock set back while the app was
not running can still defeat this, where no clock counts sleep.

# Concurrency

A [Client] is safe for concurrent use. Two calls of Do on one intent never
put two requests on the wire at once. The second waits for the first, and
both get the same outcome. A Client never changes after [New].

# Testing

Test against package fakeserver rather than a hand-made mock. Give the
Client and the fake server the same clock.Manual ([Config].Clock). Then
backoff, Retry-After, leases and retention pass without sleeping.
*/
package idem
