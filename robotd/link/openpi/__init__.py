"""The openpi policy link: drive the robot from an openpi websocket policy server.

- `codec`: openpi's msgpack format (numpy arrays as maps), bounded for hostile input;
- `wire`: what one websocket connection says (unread frames, a text frame, a close);
- `client.OpenpiLink`: the websocket client (connect with backoff, one act in flight);
- `request`: robotd's observation window → the server's request; its reply → rows;
- `options.OpenpiOptions`: the `[policy.openpi]` config table;
- `errors`: what each can raise.

Nothing is imported here, so that robotd.config can load `options` without pulling in
the websocket client.
"""
