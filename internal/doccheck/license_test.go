package doccheck

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// apache2SHA256 is the SHA-256 of the Apache License 2.0's text as the
// Apache Software Foundation publishes it (and Debian ships it, in
// /usr/share/common-licenses/Apache-2.0).
const apache2SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

// TestLicence checks the licence each module carries.
func TestLicence(t *testing.T) {
	// The root module and mobile/bind, a module of its own that is fetched
	// without the root's files, each hold the unchanged Apache-2.0 text and
	// the same NOTICE.
	t.Run("every module carries it", func(t *testing.T) {
		licence := read(t, filepath.Join(root, "LICENSE"))
		sum := sha256.Sum256([]byte(licence))
		assert.Equal(t, apache2SHA256, hex.EncodeToString(sum[:]), "LICENSE is not the Apache-2.0 text")
		notice := read(t, filepath.Join(root, "NOTICE"))
		assert.Contains(t, notice, "Copyright")
		for _, module := range []string{filepath.Join("mobile", "bind")} {
			assert.Equal(t, licence, read(t, filepath.Join(root, module, "LICENSE")), "%s/LICENSE", module)
			assert.Equal(t, notice, read(t, filepath.Join(root, module, "NOTICE")), "%s/NOTICE", module)
		}
	})
}
