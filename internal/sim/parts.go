package sim

import (
	"net/http"
	"time"

	idemclock "github.com/idemkit/idem/clock"
)

// parts are what a device and its apps reach through: the network to the
// server, the true time, the device's clock and radio. The app's
// behaviours (app.go) use nothing else of a mode's machinery. So the
// behaviours stay one, and each mode brings its own parts.
type parts interface {
	// now is the true time, as the world knows it.
	now() time.Time
	// network is the device's connection to the server.
	network(d *device) http.RoundTripper
	// clock is the device's clock, as its Clients see it.
	clock(d *device) idemclock.Clock
	// written counts the requests the device wrote to a connection:
	// what the client's trace sees as WroteHeaders.
	written(d *device) int
	// radioDown cuts the device's network for dur. restore brings it
	// back as it was.
	radioDown(d *device, dur time.Duration) (restore func())
}

// virtualParts are the virtual world's parts: its clock and its modelled
// network (network.go).
type virtualParts struct{ w *world }

func (p virtualParts) now() time.Time { return p.w.clk.now }

func (virtualParts) network(d *device) http.RoundTripper { return transport{d} }

func (virtualParts) clock(d *device) idemclock.Clock { return deviceClock{d} }

func (virtualParts) written(d *device) int { return d.written }

func (p virtualParts) radioDown(d *device, dur time.Duration) func() {
	was := d.offline
	d.offline = p.w.clk.now.Add(dur)
	return func() { d.offline = was }
}
