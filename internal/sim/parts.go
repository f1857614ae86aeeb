package sim

import (
	"net/http"
	"time"

	idemclock "github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// parts are what the devices and their apps reach through: the network to
// the server, the true time, the device's clock, radio and disk. The
// app's behaviours (app.go) and the devices' (device.go) use nothing else
// of a mode's machinery. So the behaviours stay one, and each mode brings
// its own parts.
type parts interface {
	// now is the true time, as the world knows it.
	now() time.Time
	// epoch is where the true time started.
	epoch() time.Time
	// advanceTo lets the true time pass until t. What is due meanwhile
	// happens first: requests in transit arrive.
	advanceTo(t time.Time)
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
	// newStore is the store of device id, made as the device is.
	newStore(id int) persist.Store
	// died tells the parts that d's process ended.
	died(d *device)
	// charges are the provider's charges, dead workers' included.
	charges() []charge
}

// virtualParts are the virtual world's parts: its clock and its modelled
// network (network.go) and server (server.go).
type virtualParts struct{ w *world }

func (p virtualParts) now() time.Time { return p.w.clk.now }

func (virtualParts) epoch() time.Time { return epoch }

func (p virtualParts) advanceTo(t time.Time) { p.w.clk.advanceTo(t) }

func (virtualParts) network(d *device) http.RoundTripper { return transport{d: d} }

func (virtualParts) clock(d *device) idemclock.Clock { return deviceClock{d} }

func (virtualParts) written(d *device) int { return d.written }

func (p virtualParts) radioDown(d *device, dur time.Duration) func() {
	return radioDown(d, p.w.clk.now, dur)
}

func (virtualParts) newStore(int) persist.Store { return persist.NewMemory(nil) }

func (virtualParts) died(*device) {}

func (p virtualParts) charges() []charge { return p.w.server.charges() }

// radioDown takes d off the network from now for dur.
func radioDown(d *device, now time.Time, dur time.Duration) func() {
	was := d.offline
	d.offline = now.Add(dur)
	return func() { d.offline = was }
}
