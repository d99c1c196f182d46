package redlock

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"
)

// nodeSub is one node's subscription.
type nodeSub struct {
	ch   <-chan struct{}
	stop func()
}

// Subscribe implements dlock.Notifier. It subscribes to key's release
// channel on every node concurrently and returns once a quorum confirmed
// (the holder holds a quorum too, so one of them publishes its release);
// fewer within WithSubscribeTimeout is an error joining one
// *dlock.NodeError per failed node. The channel (buffer one) receives a
// value after a release on any node; stop ends every node's subscription.
func (b *Backend) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := b.checkKey(ctx, key); err != nil {
		return nil, nil, err
	}
	timeout := b.cfg.subTimeout
	deadline := time.Now().Add(timeout)
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, grace: true},
		func(ctx context.Context, i int) (nodeSub, error) {
			ch, stop, err := b.nodes[i].Watch(ctx, key)
			return nodeSub{ch, stop}, err
		},
		quorumJudge(b.quorum, func(_ nodeSub, err error) bool { return err == nil }),
		func(_ int, s nodeSub, err error) {
			if err == nil {
				s.stop() // confirmed after we stopped waiting
			}
		})
	var subs []nodeSub
	for _, a := range ans {
		if a.done && a.err == nil {
			subs = append(subs, a.val)
		}
	}
	stopAll := func() {
		for _, s := range subs {
			s.stop()
		}
	}
	if err != nil {
		stopAll()
		return nil, nil, fmt.Errorf("redlock: subscribe %q: %w", key, err)
	}
	if len(subs) < b.quorum {
		stopAll()
		return nil, nil, joinErrs(
			fmt.Errorf("redlock: subscribe %q: %d of %d nodes confirmed, the quorum is %d", key, len(subs), len(b.nodes), b.quorum),
			nodeErrors(b, b.all, ans, deadline, timeout, nil))
	}

	out := make(chan struct{}, 1)
	quit := make(chan struct{})
	exited := make(chan struct{})
	cases := make([]reflect.SelectCase, 0, len(subs)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(quit)})
	for _, s := range subs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.ch)})
	}
	go func() {
		defer close(exited)
		for {
			chosen, _, ok := reflect.Select(cases)
			if chosen == 0 {
				return
			}
			if !ok {
				cases[chosen].Chan = reflect.Value{} // closed: ignore from now on
				continue
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	stop := sync.OnceFunc(func() {
		close(quit)
		<-exited
		stopAll()
	})
	return out, stop, nil
}
