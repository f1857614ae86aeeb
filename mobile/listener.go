package mobile

import "github.com/idemkit/idem"

// AttemptEvent describes one attempt of a call.
type AttemptEvent struct {
	// Key is the intent's Idempotency-Key.
	Key string
	// Number is 1 for a call's first attempt.
	Number int64
	// Status is the answer's HTTP status, or 0 when none came (a network
	// error).
	Status int64
	// Error is the network error's text, or "".
	Error string
	// Retry says whether another attempt follows, after WaitMillis.
	Retry      bool
	WaitMillis int64
}

// Listener receives attempt events, for a "retrying in 3 s" line on the
// payment screen; set it as Config.Listener before Open. OnAttempt is called on a goroutine of its own, never on
// the thread that made the call, in the order the attempts happened.
type Listener interface {
	OnAttempt(e *AttemptEvent)
}

// eventQueue hands events to the listener without ever blocking the call
// that made them: a full queue drops the event.
type eventQueue struct {
	listener Listener // nil: no events are made
	ch       chan *AttemptEvent
	done     chan struct{}
}

const eventQueueSize = 256

func newEventQueue(l Listener) *eventQueue {
	q := &eventQueue{listener: l, ch: make(chan *AttemptEvent, eventQueueSize), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *eventQueue) run() {
	defer close(q.done)
	for e := range q.ch {
		q.listener.OnAttempt(e)
	}
}

// hook is the idem attempt hook: it runs on the call's goroutine and must
// not block.
func (q *eventQueue) hook(a idem.Attempt) {
	if q.listener == nil {
		return
	}
	e := &AttemptEvent{
		Key:        a.Key,
		Number:     int64(a.Number),
		Status:     int64(a.StatusCode),
		Retry:      a.Retry,
		WaitMillis: a.Wait.Milliseconds(),
	}
	if a.Err != nil {
		e.Error = a.Err.Error()
	}
	select {
	case q.ch <- e:
	default:
		// The listener did not keep up: the event is dropped, and the
		// call goes on.
	}
}

// close stops the queue once the events already queued are delivered.
func (q *eventQueue) close() {
	close(q.ch)
	<-q.done
}
