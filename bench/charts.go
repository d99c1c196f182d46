package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

type series struct {
	name string
	key  string
}

// hbar draws one horizontal (grouped) bar chart of the measured subjects,
// first subject at the top.
func hbar(title, xlabel string, outs []*outcome, ss []series, xmax float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.X.Min = 0
	if xmax > 0 {
		p.X.Max = xmax
	}
	names := make([]string, len(outs))
	for i, o := range outs {
		names[len(outs)-1-i] = o.s.name
	}
	bw := vg.Points(18 / float64(len(ss)))
	for j, s := range ss {
		vals := make(plotter.Values, len(outs))
		for i, o := range outs {
			v := o.value(s.key)
			if math.IsNaN(v) {
				v = 0
			}
			vals[len(outs)-1-i] = v
		}
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			continue
		}
		b.Horizontal = true
		b.Color = palette[j%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(float64(len(ss)-1)/2-float64(j)) * bw
		p.Add(b)
		if len(ss) > 1 {
			p.Legend.Add(s.name, b)
		}
	}
	p.Legend.Top = true
	p.NominalY(names...)
	p.X.Tick.Marker = commaTicks{}
	p.Add(plotter.NewGrid())
	return p
}

// dots draws a dot plot on a logarithmic axis (the figures span orders of
// magnitude): one marker per series and subject, first subject at the top.
// Values ≤ 0 are left out.
func dots(title, xlabel string, outs []*outcome, ss []series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	names := make([]string, len(outs))
	for i, o := range outs {
		names[len(outs)-1-i] = o.s.name
	}
	shapes := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.BoxGlyph{}}
	lo, hi := math.Inf(1), math.Inf(-1)
	for j, s := range ss {
		var xys plotter.XYs
		for i, o := range outs {
			v := o.value(s.key)
			if math.IsNaN(v) || v <= 0 {
				continue
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			y := float64(len(outs)-1-i) + 0.15*(float64(len(ss)-1)/2-float64(j))
			xys = append(xys, plotter.XY{X: v, Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			continue
		}
		sc.GlyphStyle.Color = palette[j%len(palette)]
		sc.GlyphStyle.Shape = shapes[j%len(shapes)]
		sc.GlyphStyle.Radius = vg.Points(4)
		p.Add(sc)
		if len(ss) > 1 {
			p.Legend.Add(s.name, sc)
		}
	}
	if !math.IsInf(lo, 0) {
		p.X.Min, p.X.Max = lo/2, hi*2
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.NominalY(names...)
	p.Y.Min, p.Y.Max = -0.6, float64(len(outs))-0.4
	p.Add(plotter.NewGrid())
	return p
}

// commaTicks labels a linear axis' default ticks with thousands separators.
type commaTicks struct{}

func (commaTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = num(ts[i].Value, 0)
			if math.Abs(ts[i].Value) < 10 && ts[i].Value != math.Trunc(ts[i].Value) {
				ts[i].Label = num(ts[i].Value, 2)
			}
		}
	}
	return ts
}

// measuredWith returns the outcomes of res that have key.
func measuredWith(res *result, key string) []*outcome {
	var out []*outcome
	if res == nil {
		return nil
	}
	for _, o := range res.outs {
		if !math.IsNaN(o.value(key)) {
			out = append(out, o)
		}
	}
	return out
}

// saveRow draws plots side by side into path (.svg or .png).
func saveRow(path string, plots []*plot.Plot, rows int) error {
	w := vg.Length(len(plots)) * 4.2 * vg.Inch
	if len(plots) == 1 {
		w = 6 * vg.Inch
	}
	h := 1.2*vg.Inch + vg.Length(rows)*0.3*vg.Inch
	var c vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
	default:
		c = vgsvg.New(w, h)
	}
	dc := draw.New(c)
	t := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 6, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	cs := plot.Align([][]*plot.Plot{plots}, t, dc)
	for i, p := range plots {
		p.Draw(cs[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeCharts draws the S1, S3 and S5 charts into dir and returns their
// references relative to rel (the markdown file's directory).
func writeCharts(r *report, dir, rel, ext string) ([]chartRef, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var refs []chartRef
	add := func(sc, title, name string, plots []*plot.Plot, rows int) error {
		if len(plots) == 0 || rows == 0 {
			return nil
		}
		path := filepath.Join(dir, name+"."+ext)
		if err := saveRow(path, plots, rows); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		rp, err := filepath.Rel(rel, path)
		if err != nil {
			rp = path
		}
		refs = append(refs, chartRef{scenario: sc, title: title, path: filepath.ToSlash(rp)})
		return nil
	}
	if s1 := measuredWith(r.result("S1"), "p50"); len(s1) > 0 {
		p := dots("S1 uncontended acquire + release latency", "µs, log scale (lower is better)", s1,
			[]series{{"p50", "p50"}, {"p99", "p99"}})
		if err := add("S1", "S1 latency", "s1_latency", []*plot.Plot{p}, len(s1)); err != nil {
			return nil, err
		}
	}
	if s3 := measuredWith(r.result("S3"), "handoffs/s"); len(s3) > 0 {
		p1 := dots("S3 hand-offs to another client per second", "hand-offs/s, log scale (higher is better)", s3, []series{{"hand-offs/s", "handoffs/s"}})
		p2 := hbar("S3 fairness: Jain's index", "Jain's index (1 = equal shares)", s3, []series{{"Jain", "jain"}}, 1)
		if err := add("S3", "S3 hand-offs and fairness", "s3_handoffs_fairness", []*plot.Plot{p1, p2}, len(s3)); err != nil {
			return nil, err
		}
	}
	if s5 := measuredWith(r.result("S5"), "leases"); len(s5) > 0 {
		var plots []*plot.Plot
		if net := measuredWith(r.result("S5"), "rt/1k/tick"); len(net) > 0 {
			// Same subject rows in every tile: subjects without a network
			// figure (in-process) show no bar.
			plots = append(plots, dots("S5 renewal round trips", "per 1,000 leases per tick (TTL/3), log scale", s5, []series{{"rt", "rt/1k/tick"}}))
		}
		plots = append(plots,
			hbar("S5 client memory per lease", "bytes per lease", s5, []series{{"heap", "heap B/l"}, {"stacks", "stack B/l"}}, 0),
			hbar("S5 client CPU during the hold", "CPU seconds", s5, []series{{"CPU s", "cpu s"}}, 0))
		if err := add("S5", "S5 cost", "s5_cost", plots, len(s5)); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(refs, func(a, b chartRef) int { return strings.Compare(a.scenario, b.scenario) })
	return refs, nil
}
