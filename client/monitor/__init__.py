"""What people see of a swarm: one typed read of its records, the terminal tables and the web page.

 * snapshot.py - SwarmSnapshot: one typed read of a swarm's records (monitor, demo, scripts); the plan shown as the
                 coordinator priced it
 * render.py   - everything drawn for people: the monitor's tables, the demo's live view and summary
 * web.py      - `monitor --web`: the live page and /api/v1/state (aiohttp; static/ holds its HTML, JS, CSS)

It sits above the peer room (it reads the coordinator's views of the records, as a coordinator would), below the
CLI; the package imports none of them.
"""
