package main

import (
	"math"
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 < p ≤ 100, nearest rank) of
// ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// median returns the median of xs (the mean of the middle two for an even
// count), NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// maxOf returns the largest of xs, NaN for none.
func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return slices.Max(xs)
}

// jain returns Jain's fairness index of xs: (Σx)² / (n·Σx²), 1 when all
// are equal, 1/n when one takes everything.
func jain(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// spin busy-waits for d: time.Sleep cannot sleep 100 µs (here it sleeps
// about 1 ms), and a holder doing 100 µs of work keeps its CPU anyway.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
	}
}
