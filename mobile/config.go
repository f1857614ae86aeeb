package mobile

import (
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// Config says where a Client keeps its state and whom it talks to. It
// names whom the Client tells about its attempts and asks for credentials.
// Make one with NewConfig and change its fields before Open. Open takes a
// copy, so a change after it changes no Client. Durations are in
// milliseconds. Open refuses a negative one, and one above about 292
// years, the most a duration holds.
type Config struct {
	// StateDir is the directory the intents are kept in. Use the app's
	// private files directory (Android: Context.getFilesDir() + "/idem";
	// iOS: Application Support + "/idem"). Never use a cache directory,
	// which the system may clear while a payment is unresolved.
	StateDir string
	// BaseURL is the API's root, such as "https://api.example.com". Paths
	// given to Pay are resolved against it. A path that would leave its
	// origin (scheme, host, port) is refused with KindBadInput. One such
	// path is "//other.example/payments". So the Authorizer's credentials
	// go only to the API.
	BaseURL string
	// Mark says how the server marks its answers as its own. So a captive
	// portal's page or a CDN's is never taken for the server's word. Open
	// refuses a Config without one, with an error of kind config that
	// lists the choices:
	//   - "echo": the server echoes the Idempotency-Key in every answer,
	//     as idem's middleware and the contract's servers do;
	//   - "stripe", "adyen": those APIs, which echo it;
	//   - "increase": Increase's API, whose first answer is recognised by
	//     the key in its body;
	//   - "json-id": a plain server whose 2xx answers are JSON carrying
	//     the resource's id at MarkIDPath.
	// Any other answer without the mark never settles a payment.
	Mark string
	// MarkIDPath is where the "json-id" mark finds the resource's id. It
	// is a field name, or a dotted path such as "data.id". Default "id".
	MarkIDPath string
	// LookupPath is the server's lookup of a payment by key, with {key}
	// where the key goes. The default is the contract's
	// "/payments?idempotency_key={key}". Open refuses one that would
	// leave BaseURL's origin.
	LookupPath string
	// ForegroundBudgetMillis bounds Pay and PayAnew, since a tap wants an
	// answer in seconds. Default 15,000.
	ForegroundBudgetMillis int64
	// BackgroundBudgetMillis bounds Settle. A background settle may wait
	// longer for a server that asks to. Default 120,000.
	BackgroundBudgetMillis int64
	// RetentionMillis is how long the server keeps its idempotency
	// records, as it publishes. The client stops sending a key an hour
	// before. Default 24 hours.
	RetentionMillis int64
	// MaxAttempts bounds the attempts of one call. Default 10.
	MaxAttempts int64
	// Listener, if not nil, receives the attempt events of every call of
	// the Client, from its first. It is the Client's for its life. To show
	// them on the screen now open, have it forward to that screen.
	Listener Listener
	// Authorizer, if not nil, is asked for the Authorization header of
	// every attempt, from the Client's first. It is the Client's for its
	// life. Have it read the session at each call. Then a sign-in or a
	// refreshed token takes effect on the next attempt.
	Authorizer Authorizer
}

// Defaults of a Config.
const (
	defaultLookupPath             = "/payments?idempotency_key={key}"
	defaultMarkIDPath             = "id"
	defaultForegroundBudgetMillis = 15_000
	defaultBackgroundBudgetMillis = 120_000
	defaultRetentionMillis        = 24 * 60 * 60 * 1000
	defaultMaxAttempts            = 10
	// maxMillis is the largest number of milliseconds a time.Duration
	// holds, about 292 years.
	maxMillis = math.MaxInt64 / int64(time.Millisecond)
)

// NewConfig returns a Config with the defaults. It keeps intents in
// stateDir and talks to baseURL.
func NewConfig(stateDir, baseURL string) *Config {
	return &Config{
		StateDir:               stateDir,
		BaseURL:                baseURL,
		LookupPath:             defaultLookupPath,
		ForegroundBudgetMillis: defaultForegroundBudgetMillis,
		BackgroundBudgetMillis: defaultBackgroundBudgetMillis,
		RetentionMillis:        defaultRetentionMillis,
		MaxAttempts:            defaultMaxAttempts,
	}
}

// check returns the config with defaults filled in and the base URL
// parsed. Otherwise it returns an error of kind config.
func (c *Config) check() (Config, *url.URL, error) {
	if c == nil {
		return Config{}, nil, newError(kindConfig, "no config")
	}
	cfg := *c
	if cfg.StateDir == "" {
		return cfg, nil, newError(kindConfig, "StateDir is empty")
	}
	base, err := url.Parse(cfg.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return cfg, nil, newError(kindConfig, "BaseURL "+shownURL(cfg.BaseURL)+" is not an http or https URL")
	}
	if cfg.LookupPath == "" {
		cfg.LookupPath = defaultLookupPath
	}
	if cfg.MarkIDPath == "" {
		cfg.MarkIDPath = defaultMarkIDPath
	}
	if _, err := cfg.mark(); err != nil {
		return cfg, nil, err
	}
	if !strings.Contains(cfg.LookupPath, "{key}") {
		return cfg, nil, newError(kindConfig, fmt.Sprintf("LookupPath %q has no {key}", cfg.LookupPath))
	}
	if _, err := resolve(base, "LookupPath", strings.ReplaceAll(cfg.LookupPath, "{key}", "k")); err != nil {
		// Another origin's answers would settle the user's payments.
		return cfg, nil, err
	}
	for _, f := range []struct {
		v   *int64
		def int64
		max int64
		nm  string
	}{
		{&cfg.ForegroundBudgetMillis, defaultForegroundBudgetMillis, maxMillis, "ForegroundBudgetMillis"},
		{&cfg.BackgroundBudgetMillis, defaultBackgroundBudgetMillis, maxMillis, "BackgroundBudgetMillis"},
		{&cfg.RetentionMillis, defaultRetentionMillis, maxMillis, "RetentionMillis"},
		{&cfg.MaxAttempts, defaultMaxAttempts, math.MaxInt32, "MaxAttempts"},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			return cfg, nil, newError(kindConfig, fmt.Sprintf("%s is negative (%d)", f.nm, *f.v))
		case *f.v > f.max:
			// In nanoseconds, or in an int on a 32-bit device, it would
			// wrap around to another value.
			return cfg, nil, newError(kindConfig, fmt.Sprintf("%s is %d, above the largest (%d)", f.nm, *f.v, f.max))
		}
	}
	return cfg, base, nil
}

// marks are the Marks a Config may name, in the order its error lists
// them. "json-id" is made with MarkIDPath.
var marks = []struct {
	name string
	mark idem.Mark
}{
	{"echo", idem.MarkEcho},
	{"stripe", idem.MarkStripe},
	{"adyen", idem.MarkAdyen},
	{"increase", idem.MarkIncrease},
	{"json-id", idem.Mark{}},
}

// mark returns the idem.Mark the Config names. Otherwise it returns an
// error of kind config that names the choices.
func (c *Config) mark() (idem.Mark, error) {
	var names []string
	for _, m := range marks {
		names = append(names, fmt.Sprintf("%q", m.name))
		if m.name != c.Mark {
			continue
		}
		if m.name == "json-id" {
			for _, s := range strings.Split(c.MarkIDPath, ".") {
				if s == "" {
					return idem.Mark{}, newError(kindConfig, fmt.Sprintf("MarkIDPath %q has an empty segment: give a field name such as \"id\", or a dotted path such as \"data.id\"", c.MarkIDPath))
				}
			}
			return idem.MarkJSONID(c.MarkIDPath), nil
		}
		return m.mark, nil
	}
	what := "Mark is not set"
	if c.Mark != "" {
		what = fmt.Sprintf("Mark %q is not one of the choices", c.Mark)
	}
	return idem.Mark{}, newError(kindConfig, what+": say how the server marks its answers as its own: "+strings.Join(names, ", ")+
		" (see Config.Mark); an answer without the mark never settles a payment")
}

// resolve returns the absolute URL of path, relative to the base. what
// names path in the error. A path that would leave the base's origin is
// refused, such as "//other.example/payments" or an absolute URL. Its
// request would carry the Authorizer's credentials to another server.
func resolve(base *url.URL, what, path string) (string, error) {
	ref, err := url.Parse(path)
	if err != nil {
		return "", newError(KindBadInput, what+" "+shownURL(path)+" does not parse")
	}
	u := base.ResolveReference(ref)
	if u.Scheme != base.Scheme || !strings.EqualFold(u.Host, base.Host) || u.User.String() != base.User.String() {
		return "", newError(KindBadInput, what+" "+shownURL(path)+" leaves BaseURL's origin: give a path on the API, such as \"/payments\"")
	}
	return u.String(), nil
}

// shownURL returns raw quoted as a config error may show it, with no
// credential in it. It redacts more than the root package's error texts
// do. It hides the user information whole and the fragment. It hides the
// value of every query parameter, not only those named for a credential.
// A bare parameter is hidden whole. A URL that does not parse is not
// shown at all.
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(not shown: it does not parse)"
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, part := range parts {
			if name, _, ok := strings.Cut(part, "="); ok {
				parts[i] = name + "=" + redacted
			} else {
				parts[i] = redacted // a bare value, a token maybe
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return fmt.Sprintf("%q", u.String())
}

// redacted stands for what shownURL hides, as in url.URL.Redacted.
const redacted = "xxxxx"
