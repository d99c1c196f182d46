package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"
)

// saved is a run's raw results, written next to the charts
// (results.json) so that the report can be rendered again (-render)
// without measuring again: the figures stay those of the run.
type saved struct {
	Cmd      string        `json:"cmd"`
	Config   savedConfig   `json:"config"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration"`
	LoadAvg  [2]string     `json:"load_avg"`
	Machine  []string      `json:"machine"`
	Versions []string      `json:"versions"`
	Libs     []string      `json:"libraries"`
	Results  []savedResult `json:"results"`
	Skipped  []string      `json:"skipped_scenarios"`
	// Notes are remarks added to a scenario's section by hand after the
	// run (by scenario id; "targets" for the list under the targets
	// table, such as why a target was not met); they never change a
	// figure.
	Notes map[string][]string `json:"notes,omitempty"`
}

type savedResult struct {
	Scenario string         `json:"scenario"`
	Duration time.Duration  `json:"duration"`
	Outcomes []savedOutcome `json:"outcomes"`
}

type savedOutcome struct {
	Subject string    `json:"subject"`
	Skip    string    `json:"skip,omitempty"`
	Runs    []metrics `json:"runs,omitempty"`
	Errs    []string  `json:"errors,omitempty"`
	Med     metrics   `json:"median,omitempty"`
}

type savedConfig struct {
	Quick     bool          `json:"quick"`
	Runs      int           `json:"runs"`
	TTL       time.Duration `json:"ttl"`
	Poll      time.Duration `json:"poll"`
	S1Dur     time.Duration `json:"s1_dur"`
	S2Dur     time.Duration `json:"s2_dur"`
	S2Workers int           `json:"s2_workers"`
	S3Dur     time.Duration `json:"s3_dur"`
	S3Workers int           `json:"s3_workers"`
	S3Hold    time.Duration `json:"s3_hold"`
	S4TTL     time.Duration `json:"s4_ttl"`
	S4Reps    int           `json:"s4_reps"`
	S5Leases  int           `json:"s5_leases"`
	S5Hold    time.Duration `json:"s5_hold"`
	S5TTL     time.Duration `json:"s5_ttl"`
	S5FillMax time.Duration `json:"s5_fill_max"`
	S6Dur     time.Duration `json:"s6_dur"`
	S6Down    int           `json:"s6_down"`
}

func saveConfig(c config) savedConfig {
	return savedConfig{c.quick, c.runs, c.ttl, c.poll, c.s1Dur, c.s2Dur, c.s2Workers, c.s3Dur, c.s3Workers,
		c.s3Hold, c.s4TTL, c.s4Reps, c.s5Leases, c.s5Hold, c.s5TTL, c.s5FillMax, c.s6Dur, c.s6Down}
}

func (s savedConfig) config() config {
	return config{s.Quick, s.Runs, s.TTL, s.Poll, s.S1Dur, s.S2Dur, s.S2Workers, s.S3Dur, s.S3Workers,
		s.S3Hold, s.S4TTL, s.S4Reps, s.S5Leases, s.S5Hold, s.S5TTL, s.S5FillMax, s.S6Dur, s.S6Down}
}

// clean returns m without its NaN and infinite figures (JSON has none),
// or nil if m is nil.
func clean(m metrics) metrics {
	if m == nil {
		return nil
	}
	out := metrics{}
	for k, v := range m {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out[k] = v
		}
	}
	return out
}

func (r *report) save(path string) error {
	s := saved{
		Cmd: r.cmd, Config: saveConfig(r.c), Started: r.started, Duration: r.duration, LoadAvg: r.loadAvg,
		Machine: r.machine, Versions: r.versions, Libs: r.libs, Notes: r.notes,
	}
	for _, sc := range r.skipped {
		s.Skipped = append(s.Skipped, sc.id)
	}
	for _, res := range r.results {
		sr := savedResult{Scenario: res.sc.id, Duration: res.duration}
		for _, o := range res.outs {
			so := savedOutcome{Subject: o.s.id, Skip: o.skip, Errs: o.errs, Med: clean(o.med)}
			for _, m := range o.runs {
				so.Runs = append(so.Runs, clean(m))
			}
			sr.Outcomes = append(sr.Outcomes, so)
		}
		s.Results = append(s.Results, sr)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// loadReport reads a results.json written by save.
func loadReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s saved
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r := &report{
		cmd: s.Cmd, c: s.Config.config(), started: s.Started, duration: s.Duration, loadAvg: s.LoadAvg,
		machine: s.Machine, versions: s.Versions, libs: s.Libs, notes: s.Notes,
	}
	scs := map[string]*scenario{}
	for _, sc := range allScenarios() {
		scs[sc.id] = sc
	}
	for _, id := range s.Skipped {
		if sc := scs[id]; sc != nil {
			r.skipped = append(r.skipped, sc)
		}
	}
	for _, sr := range s.Results {
		sc := scs[sr.Scenario]
		if sc == nil {
			return nil, fmt.Errorf("%s: unknown scenario %q", path, sr.Scenario)
		}
		res := &result{sc: sc, duration: sr.Duration}
		for _, so := range sr.Outcomes {
			sub := subjectByID(so.Subject)
			if sub == nil {
				return nil, fmt.Errorf("%s: unknown subject %q", path, so.Subject)
			}
			res.outs = append(res.outs, &outcome{s: sub, skip: so.Skip, runs: so.Runs, errs: so.Errs, med: so.Med})
		}
		r.results = append(r.results, res)
	}
	return r, nil
}
