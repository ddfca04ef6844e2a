package statusui

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "write the realistic page's screenshot to docs/ui.png")

// UITestsEnv, when "require", makes a missing Chromium a test failure
// instead of a skip (`make test` sets it).
const UITestsEnv = "TRUSTBRIDGE_UI_TESTS"

// ChromiumEnv names a Chromium binary other than the Debian package's.
const ChromiumEnv = "TRUSTBRIDGE_CHROMIUM"

const screenshotPath = "../../../docs/ui.png"

// screenshotWidth is the browser window's width; the page is captured in
// a tall window and cropped below its last content.
const screenshotWidth, screenshotHeight = 1400, 4200

func chromium(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv(ChromiumEnv), "/usr/bin/chromium", "chromium", "chromium-browser"}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv(UITestsEnv) == "require" {
		t.Fatalf("chromium not found and %s=require: run `make ui-tools` (apt-get install chromium)", UITestsEnv)
	}
	t.Skipf("chromium not found (set %s=require to fail instead; `make ui-tools` installs it)", UITestsEnv)
	return ""
}

// runChromium runs headless Chromium on url with extra arguments and
// returns its standard output. Chromium is kept on loopback: every host
// name but 127.0.0.1 fails to resolve.
func runChromium(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps", "--no-default-browser-check",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--user-data-dir=" + t.TempDir(),
	}
	args = append(append(args, extra...), url)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\nstderr:\n%s", extra, err, stderr.String())
	}
	return stdout.Bytes()
}

// uiServer serves the status page of s on 127.0.0.1.
func uiServer(t *testing.T, s api.Snapshot, fs []api.Finding) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/ui", Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	require.True(t, strings.HasPrefix(srv.URL, "http://127.0.0.1:"), srv.URL)
	return srv.URL + "/ui"
}

// TestChromiumStatusPage loads the realistic page in headless Chromium,
// checks the DOM it built and takes the screenshot docs/ui.png shows.
func TestChromiumStatusPage(t *testing.T) {
	bin := chromium(t)
	s, fs := realisticSnapshot()
	url := uiServer(t, s, fs)

	d := parseDOM(t, bytes.NewReader(runChromium(t, bin, url, "--dump-dom")))
	assertInert(t, d)
	assert.Equal(t, "prod.acme.example", text(d.byID("local-trust-domain")))
	rows := d.withClass("td-row")
	require.Len(t, rows, len(s.TrustDomains))
	for i, td := range s.TrustDomains {
		assert.Equal(t, td.Name, attr(rows[i], "data-td"))
	}
	graph := d.byID("federation-graph")
	require.NotNil(t, graph)
	assert.Equal(t, "svg", graph.Data)
	assert.Len(t, parseDOMNode(graph).withClass("node"), len(s.TrustDomains))
	assert.Len(t, parseDOMNode(graph).withClass("edge"), len(s.TrustDomains)-1)
	timeline := d.byID("authority-timeline")
	require.NotNil(t, timeline)
	assert.Equal(t, "svg", timeline.Data)
	assert.Len(t, parseDOMNode(timeline).withClass("authority"), 8)
	today := d.byID("today-line")
	require.NotNil(t, today)
	assert.Equal(t, "line", today.Data)
	assert.Equal(t, "today 2026-11-22", text(d.byID("today-label")))
	assert.Len(t, d.withClass("finding"), len(fs))

	dir := t.TempDir()
	shot := filepath.Join(dir, "ui.png")
	runChromium(t, bin, url, "--screenshot="+shot, "--hide-scrollbars", "--force-device-scale-factor=1",
		"--window-size="+itoa(screenshotWidth)+","+itoa(screenshotHeight))
	img := decodePNG(t, shot)
	cropped := cropBelowContent(img)
	b := cropped.Bounds()
	assert.Equal(t, screenshotWidth, b.Dx())
	assert.Greater(t, b.Dy(), 1500, "the page should be taller than the header")
	assert.Less(t, b.Dy(), screenshotHeight, "the window must be taller than the page, or the screenshot is cut")
	assert.Greater(t, distinctColours(cropped), 200, "the screenshot looks blank")
	if *updateScreenshot {
		require.NoError(t, os.MkdirAll(filepath.Dir(screenshotPath), 0o755))
		var buf bytes.Buffer
		enc := png.Encoder{CompressionLevel: png.BestCompression}
		require.NoError(t, enc.Encode(&buf, cropped))
		require.NoError(t, os.WriteFile(screenshotPath, buf.Bytes(), 0o644))
		t.Logf("wrote %s (%dx%d)", screenshotPath, b.Dx(), b.Dy())
	}
}

// TestChromiumHostileStrings checks, in the DOM a real browser built, that
// markup in subjects, errors and names stayed text.
func TestChromiumHostileStrings(t *testing.T) {
	bin := chromium(t)
	s, fs := hostileSnapshot()
	dump := runChromium(t, bin, uiServer(t, s, fs), "--dump-dom")
	d := parseDOM(t, bytes.NewReader(dump))
	assertInert(t, d)
	assert.Equal(t, hostile, text(d.byID("local-trust-domain")))
	for _, id := range []string{"findings", "trust-domains", "authorities", "federation-graph", "authority-timeline", "upstream"} {
		assert.Contains(t, text(d.byID(id)), "<script>alert(1)</script>", id)
	}
	require.NotNil(t, d.byID("today-line"))
}

// TestChromiumManyTrustDomains renders the graph with 12 federated trust
// domains and checks every node made it into the browser's DOM.
func TestChromiumManyTrustDomains(t *testing.T) {
	bin := chromium(t)
	s := manySnapshot(12)
	d := parseDOM(t, bytes.NewReader(runChromium(t, bin, uiServer(t, s, nil), "--dump-dom")))
	assertInert(t, d)
	graph := parseDOMNode(d.byID("federation-graph"))
	assert.Len(t, graph.withClass("node"), 13)
	assert.Len(t, graph.withClass("edge"), 12)
	assert.Len(t, graph.withClass("dashed"), 2)
}

// TestChromiumLongColumns lays the page out in a real browser at the
// screenshot's width and counts line boxes: a 10-digit sequence takes one
// line, and a long SPIFFE ID wraps only between its path segments, each
// segment on one line. (A script appended to a copy of the page measures;
// the page itself stays script-free.)
func TestChromiumLongColumns(t *testing.T) {
	bin := chromium(t)
	s, fs := longColumnsSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	require.Contains(t, body, "</body>")
	measured := strings.Replace(body, "</body>", measureScript+"</body>", 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(measured))
	}))
	t.Cleanup(srv.Close)

	d := parseDOM(t, bytes.NewReader(runChromium(t, bin, srv.URL, "--dump-dom", "--window-size="+itoa(screenshotWidth)+",1200")))
	var got struct {
		Seq      []int   `json:"seq"`
		IDLines  []int   `json:"idLines"`
		Segments [][]int `json:"segments"`
	}
	require.NoError(t, json.Unmarshal([]byte(text(d.byID("measure"))), &got), text(d.byID("measure")))
	require.NotEmpty(t, got.Seq)
	for i, n := range got.Seq {
		assert.Equal(t, 1, n, "sequence cell %d takes %d lines", i, n)
	}
	require.NotEmpty(t, got.IDLines)
	for i, segs := range got.Segments {
		assert.Greater(t, got.IDLines[i], 1, "the ID is wider than its column, so it wraps: otherwise this test proves nothing")
		for j, n := range segs {
			assert.Equal(t, 1, n, "ID %d segment %d is broken over %d lines", i, j, n)
		}
	}
}

// measureScript counts, per element, the distinct line tops of its text.
const measureScript = `<script>
(function () {
  function lines(node) {
    var r = document.createRange(); r.selectNodeContents(node);
    var tops = {}, rects = r.getClientRects();
    for (var i = 0; i < rects.length; i++) { if (rects[i].width > 0) { tops[Math.round(rects[i].top)] = 1; } }
    return Object.keys(tops).length;
  }
  var out = {seq: [], idLines: [], segments: []};
  document.querySelectorAll("td.seq").forEach(function (td) { out.seq.push(lines(td)); });
  document.querySelectorAll("code.spiffe-id").forEach(function (c) {
    out.idLines.push(lines(c));
    var segs = [];
    c.querySelectorAll("span.seg").forEach(function (n) { segs.push(lines(n)); });
    out.segments.push(segs);
  });
  var pre = document.createElement("pre"); pre.id = "measure"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>`

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img
}

// cropBelowContent cuts the page background off below the last row that
// differs from it, keeping a margin.
func cropBelowContent(img image.Image) image.Image {
	b := img.Bounds()
	bg := img.At(b.Min.X, b.Max.Y-1)
	last := b.Min.Y
	for y := b.Max.Y - 1; y >= b.Min.Y; y-- {
		if !rowIs(img, y, bg) {
			last = y
			break
		}
	}
	end := min(last+24, b.Max.Y)
	out := image.NewRGBA(image.Rect(0, 0, b.Dx(), end-b.Min.Y))
	for y := b.Min.Y; y < end; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			out.Set(x-b.Min.X, y-b.Min.Y, img.At(x, y))
		}
	}
	return out
}

func rowIs(img image.Image, y int, c color.Color) bool {
	r0, g0, b0, a0 := c.RGBA()
	for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
		r, g, b, a := img.At(x, y).RGBA()
		if r != r0 || g != g0 || b != b0 || a != a0 {
			return false
		}
	}
	return true
}

func distinctColours(img image.Image) int {
	seen := map[color.RGBA]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), 0}] = true
		}
	}
	return len(seen)
}

func itoa(n int) string { return strconv.Itoa(n) }
